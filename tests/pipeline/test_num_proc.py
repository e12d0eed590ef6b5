"""``num_proc``: records prepared in worker processes give the same output, report and errors as in
this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqpack.data import DataFormatError
from seqpack.pipeline import pack_dataset
from seqpack.pipeline.job import PackConfigError, PackJob


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_real_file_packs_byte_identical_with_two_processes(shared_data, tmp_path):
    src = shared_data / "llama-factory" / "alpaca_en_demo.json"
    outs = {}
    for n in (1, 2):
        res = pack_dataset(src, tmp_path / f"p{n}", seq_length=2048, num_proc=n)
        assert res.num_packs > 0
        outs[n] = _files(tmp_path / f"p{n}")
    assert outs[1].keys() == outs[2].keys() and any(k.endswith(".parquet") for k in outs[1])
    for name in outs[1]:
        if name == "metadata.json":
            m1, m2 = (json.loads(outs[n][name]) for n in (1, 2))
            assert m1["fingerprint"] == m2["fingerprint"]
            assert {k: v for k, v in m1.items() if k != "created_at"} == {k: v for k, v in m2.items() if k != "created_at"}
        else:
            assert outs[1][name] == outs[2][name], name


def _chats(n: int) -> list[str]:
    return [json.dumps({"instruction": f"say {i}", "input": "", "output": f"{i} " * (i % 7 + 1)}) for i in range(n)]


def test_bad_record_in_a_worker_raises_as_in_process(tmp_path):
    lines = _chats(700)
    lines[611] = json.dumps({"nothing": "known"})
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(lines) + "\n")
    errors = {}
    for n in (1, 2):
        with pytest.raises(DataFormatError) as exc:
            pack_dataset(src, tmp_path / f"o{n}", seq_length=512, num_proc=n)
        errors[n] = exc.value
        assert not (tmp_path / f"o{n}").exists()
    assert type(errors[1]) is type(errors[2]) and str(errors[1]) == str(errors[2])
    assert "d.jsonl" in str(errors[2]) and "line 612" in str(errors[2])
    assert (errors[1].reason, errors[1].line) == (errors[2].reason, errors[2].line)
    # skipped instead: the same report entries, in the same order
    reports = {}
    for n in (1, 2):
        pack_dataset(src, tmp_path / f"s{n}", seq_length=512, num_proc=n, on_error="skip")
        reports[n] = (tmp_path / f"s{n}" / "report.jsonl").read_bytes()
    assert reports[1] == reports[2] and b"d.jsonl:611" in reports[1]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_num_proc_is_checked_before_any_work(tmp_path, bad):
    with pytest.raises(PackConfigError, match=r"^num_proc must be an integer >= 1"):
        PackJob.create(None, tmp_path / "o", num_proc=bad)


def test_num_proc_defaults_to_automatic(tmp_path):
    assert PackJob.create(None, tmp_path / "o").num_proc is None
    assert PackJob.create(None, tmp_path / "o", num_proc=3).num_proc == 3
