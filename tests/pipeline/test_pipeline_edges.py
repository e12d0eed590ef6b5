"""Rough edges of the offline path: repeated inputs, settings checked before data, inspect hints,
shard hash verification, empty inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seqpack.algorithms import MAX_CAPACITY_UNITS
from seqpack.cli import app
from seqpack.io import PackedDatasetError, load_packed
from seqpack.pipeline import NothingToPackError, PackConfigError, dedupe_inputs, pack_dataset, sample_data_path

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _chat(n: int, tag: str = "") -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"question {tag}{i}"},
                          {"role": "assistant", "content": f"answer {tag}{i}"}]} for i in range(n)]


def _jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_repeated_input_file_read_once(tmp_path, qwen3_tokenizer):
    a = _jsonl(tmp_path / "a.jsonl", _chat(5, "a"))
    b = _jsonl(tmp_path / "b.jsonl", _chat(3, "b"))
    logs: list[str] = []
    res = pack_dataset([a, str(tmp_path / "*.jsonl"), tmp_path / "." / "a.jsonl"], tmp_path / "out",
                       tokenizer=qwen3_tokenizer, seq_length=512, log=logs.append)
    c = res.metadata.counts
    assert c["records_read"] == 8 and c["samples_packed"] == 8
    ids = [sid for row in res.load() for sid in row.sample_ids]
    assert len(ids) == len(set(ids)) == 8
    assert sum("same file" in m and "read once" in m for m in logs) == 2
    assert [Path(i["path"]).name for i in res.metadata.inputs] == ["a.jsonl", "b.jsonl"]
    # a symlink to the same file is the same input
    (tmp_path / "link.jsonl").symlink_to(b)
    assert [p.name for p in dedupe_inputs([b, tmp_path / "link.jsonl", a])] == ["b.jsonl", "a.jsonl"]


def test_a_repeated_input_is_named_as_the_user_typed_it(tmp_path, monkeypatch, caplog):
    import logging

    from seqpack.data.sources import expand_inputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "chat.jsonl", _chat(2))
    logs: list[str] = []
    got = dedupe_inputs(["data/chat.jsonl", "./data/chat.jsonl", "./data/*.jsonl", Path("data") / "chat.jsonl"],
                        logs.append)
    assert got == [Path("data/chat.jsonl")]
    tail = "(listed twice, e.g. by a path and an overlapping glob): read once, so each record is packed once"
    assert logs == [f"input ./data/chat.jsonl is the same file as data/chat.jsonl {tail}",
                    f"input ./data/chat.jsonl (matched by './data/*.jsonl') is the same file as data/chat.jsonl {tail}",
                    f"input data/chat.jsonl is the same file as data/chat.jsonl {tail}"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqpack.data.sources"):  # prepare()'s path: no log, the logger
        assert expand_inputs(["./data/chat.jsonl", "data/chat.jsonl"]) == [Path("data/chat.jsonl")]
    assert caplog.messages == [f"input data/chat.jsonl is the same file as ./data/chat.jsonl {tail}"]


def test_a_repeated_input_is_a_warning_on_the_cli_even_with_quiet(tmp_path):
    import subprocess
    import sys

    a = _jsonl(tmp_path / "a.jsonl", _chat(3))
    src = Path(__file__).resolve().parents[2] / "src"
    r = subprocess.run([sys.executable, "-m", "seqpack", "pack", str(a), str(a), "-o", str(tmp_path / "o"), "-q",
                        "--seq-length", "256"], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "PYTHONPATH": str(src)})
    assert r.returncode == 0, r.stderr
    assert f"warning: input {a} is the same file as {a} (listed twice, e.g. by a path and an overlapping glob): " \
           "read once, so each record is packed once" in r.stderr
    assert "records read" in r.stdout and " 3 " in r.stdout.replace("│", " ")


def test_huge_seq_length_refused_before_reading_data(tmp_path):
    seq = 100_000_000
    with pytest.raises(PackConfigError, match="MAX_CAPACITY_UNITS") as ei:
        pack_dataset(tmp_path / "does-not-exist.jsonl", tmp_path / "out", seq_length=seq)
    # a pack_dataset caller sees the keywords, a CLI user the flags
    assert "lower seq_length to" in str(ei.value) and "--" not in str(ei.value)
    assert str(MAX_CAPACITY_UNITS) in str(ei.value)
    # CLI: exit 2 (settings), flags named, and the (missing) input is never opened
    r = runner.invoke(app, ["pack", str(tmp_path / "does-not-exist.jsonl"), "--output", str(tmp_path / "o"),
                            "--seq-length", str(seq), "-q"])
    assert r.exit_code == 2, r.output
    assert "lower --seq-length to" in r.output and "--pad-to-multiple-of" in r.output
    assert "seq_length" not in r.output
    assert "does-not-exist" not in r.output
    # the same capacity with a large enough multiple is within the limit
    r = runner.invoke(app, ["pack", "--output", str(tmp_path / "o"), "--seq-length", str(seq),
                            "--pad-to-multiple-of", "7", "-q"])
    assert r.exit_code == 2 and "divisible" in r.output and "--seq-length" in r.output


def test_seq_length_beyond_int32_refused(tmp_path):
    with pytest.raises(PackConfigError, match="int32"):
        pack_dataset(None, tmp_path / "out", seq_length=2**31, pad_to_multiple_of=1 << 10)


def test_inspect_non_dataset_dir_suggests_new_output(tmp_path):
    d = tmp_path / "notadataset"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    r = runner.invoke(app, ["inspect", str(d), "--no-plot"])
    assert r.exit_code == 1
    text = " ".join(r.output.split())
    assert "metadata.json is missing" in text and "--output NEW_DIR" in text
    assert "--output " + str(d) not in text  # never suggest overwriting the non-dataset directory
    # and the hint is right: packing into that directory is refused even with --overwrite
    r = runner.invoke(app, ["pack", "--output", str(d), "--overwrite", "-q"])
    assert r.exit_code == 1 and "not a seqpack packed dataset" in " ".join(r.output.split())


@pytest.fixture(scope="module")
def small_packed(tmp_path_factory, qwen3_tokenizer):
    out = tmp_path_factory.mktemp("verify") / "packed"
    pack_dataset(None, out, tokenizer=qwen3_tokenizer, seq_length=1024, rows_per_shard=4)
    return out


def test_load_packed_verify_sha256(small_packed, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(small_packed, d)
    assert len(load_packed(d, verify=True)) == load_packed(d).metadata.num_packs
    shard = d / load_packed(d).metadata.shards[-1].file
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only the hash can tell
    shard.write_bytes(bytes(raw))
    load_packed(d)  # size and row count still match
    with pytest.raises(PackedDatasetError, match=r"sha256.*re-pack") as ei:
        load_packed(d, verify=True)
    assert Path(shard.name).name in str(ei.value)
    r = runner.invoke(app, ["inspect", str(d), "--verify", "--no-plot"])
    assert r.exit_code == 1 and "sha256" in r.output
    r = runner.invoke(app, ["inspect", str(small_packed), "--verify", "--no-plot"])
    assert r.exit_code == 0 and "verified sha256 of" in r.output


@pytest.mark.parametrize("content,name,why", [
    (b"", "empty.jsonl", "is empty (0 records)"),
    (b"", "empty.json", "is empty (0 records)"),  # 0 bytes: the same text as .jsonl, not "not valid JSON"
    (b" \n\r\n\t\n", "blank.json", "is empty (0 records)"),
    (b"\xef\xbb\xbf\n\n", "bom.jsonl", "is empty (0 records)"),
    (b"[]", "array.json", "holds an empty JSON array (0 records)"),
])
def test_empty_input_named(tmp_path, qwen3_tokenizer, content, name, why):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(NothingToPackError) as ei:
        pack_dataset(p, tmp_path / "out", tokenizer=qwen3_tokenizer, seq_length=512)
    assert str(ei.value) == (
        f"no record to pack: {p} {why}. Fix: check that the path points to the data file you meant (JSON array of "
        "records, JSONL with one record per line, or Parquet) and that it is not empty")
    r = runner.invoke(app, ["pack", str(p), "--output", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 1 and f"error: no record to pack: {p} {why}. Fix:" in " ".join(r.output.split())
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_empty_input_among_others_logged(tmp_path, qwen3_tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    logs: list[str] = []
    res = pack_dataset([empty, sample_data_path()], tmp_path / "out", tokenizer=qwen3_tokenizer,
                       seq_length=2048, log=logs.append)
    assert res.metadata.counts["samples_packed"] > 0
    assert f"input {empty} is empty (0 records)" in logs


def test_in_memory_records_packed_once(tmp_path, qwen3_tokenizer):
    recs = _chat(4, "m")
    res = pack_dataset(recs, tmp_path / "out", tokenizer=qwen3_tokenizer, seq_length=512)
    ids = sorted(sid for row in res.load() for sid in row.sample_ids)
    assert ids == [f"records:{i}" for i in range(4)]
