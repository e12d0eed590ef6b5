"""Stored packed data vs config (case B23): tensor-contract keys are violations, the tokenizer is
compared by identity (hashes offline, else an alias table), the algorithm is only a note."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from seqpack.config import ConfigValidationError, PackingConfig, load_recipe
from seqpack.config.tokenizers import TOKENIZER_ALIASES, canonical_tokenizer_name, compare_tokenizer


def _write(out: Path, **meta_kwargs) -> Path:
    from seqpack.sample import Sample
    from seqpack.io import write_packed
    from seqpack.io.metadata import PackedMetadata
    from seqpack.packed import build_packed_sequence

    ids = np.arange(1, 6, dtype=np.int32)
    s = Sample(ids, np.r_[ids[1:], -100].astype(np.int32), sample_id="a")
    row = build_packed_sequence([s], pad_to_multiple_of=1, pad_token_id=0, seq_length=8)
    meta = dict(seq_length=8, algorithm="balanced_best_fit")
    meta.update(meta_kwargs)
    write_packed([row], out, PackedMetadata(**meta))
    return out


@pytest.fixture(scope="module")
def qwen3_fp(qwen3_tokenizer):
    from seqpack.data.tokenizer import tokenizer_fingerprint

    return tokenizer_fingerprint(qwen3_tokenizer)


@pytest.fixture(scope="module")
def qwen3_data(tmp_path_factory, qwen3_fp):
    """Metadata exactly as `seqpack pack --tokenizer qwen3` records it (name + the writer's hashes)."""
    return _write(tmp_path_factory.mktemp("q") / "packed", tokenizer="qwen3", train_on="assistant",
                  tokenizer_hash=qwen3_fp["files_sha256"], chat_template_hash=qwen3_fp["chat_template_sha256"])


def test_canonical_tokenizer_names():
    assert canonical_tokenizer_name("qwen3") == "qwen3"
    assert canonical_tokenizer_name("Qwen/Qwen3-8B") == "qwen3"
    assert canonical_tokenizer_name("Qwen/Qwen3-235B-A22B/") == "qwen3"
    assert canonical_tokenizer_name("/models/Qwen3-8B") == "qwen3"  # a folder by its base name
    assert canonical_tokenizer_name("/root/.cache/huggingface/hub/models--Qwen--Qwen3-14B/snapshots/abc123") == "qwen3"
    # not the hybrid-thinking template: never aliased to the embedded tokenizer
    assert canonical_tokenizer_name("Qwen/Qwen3-4B-Instruct-2507") == "qwen/qwen3-4b-instruct-2507"
    assert canonical_tokenizer_name("Qwen/Qwen3-8B-Base") == "qwen/qwen3-8b-base"
    assert canonical_tokenizer_name("meta-llama/Meta-Llama-3-8B-Instruct") == "meta-llama/meta-llama-3-8b-instruct"
    assert "qwen3-8b" in TOKENIZER_ALIASES["qwen3"]


def test_B23_readme_flow_recipe_hub_name_accepts_qwen3_data(qwen3_data):
    """Packed with `--tokenizer qwen3` + CLI default algorithm; config names the hub checkpoint."""
    cfg = load_recipe("qwen3_sft", seq_length=8, tokenizer="Qwen/Qwen3-8B", packed_dataset_path=str(qwen3_data))
    res = cfg.check_packed_data()
    assert res.violations == []
    assert any("algorithm: stored 'balanced_best_fit' vs config 'first_fit_shuffle'" in n for n in res.notes)
    tok_note = [n for n in res.notes if "tokenizer" in n and "algorithm" not in n]
    assert len(tok_note) == 1 and "compared by name only" in tok_note[0] and "normalise to 'qwen3'" in tok_note[0]


def test_B23_shipped_qwen3_recipe_compares_hashes(qwen3_data):
    cfg = load_recipe("qwen3_sft", seq_length=8)
    assert cfg.tokenizer == "qwen3" and load_recipe("qwen3_sft_cp2").tokenizer == "qwen3"
    res = cfg.check_packed_data(qwen3_data)
    assert res.path == str(qwen3_data) and res.violations == []
    assert any("file and chat-template hashes equal" in n for n in res.notes)


def test_B23_tokenizer_hash_mismatch_is_stale(tmp_path, qwen3_fp):
    out = _write(tmp_path / "p", tokenizer="qwen3", tokenizer_hash="0" * 64,
                 chat_template_hash=qwen3_fp["chat_template_sha256"])
    (v,) = PackingConfig(seq_length=8, tokenizer="qwen3").packed_data_violations(out)
    assert v.rule == "stale_packed_data" and v.keys == ("packed_dataset_path", "tokenizer")
    assert "files sha256 stored 000000000000 vs config " + qwen3_fp["files_sha256"][:12] in v.problem
    assert "chat template" not in v.problem
    assert "set tokenizer: to the name or local folder used for packing ('qwen3')" in v.fix


def test_B23_local_folder_same_content_and_changed_template(tmp_path, qwen3_data):
    from seqpack.data.tokenizer import embedded_tokenizer_path

    same = tmp_path / "Qwen3-8B"
    shutil.copytree(embedded_tokenizer_path("qwen3"), same)
    conf = json.loads((same / "tokenizer_config.json").read_text())
    conf["model_max_length"] = 40960  # another checkpoint's config file: other bytes, same tokenizer
    (same / "tokenizer_config.json").write_text(json.dumps(conf))
    res = PackingConfig(seq_length=8, tokenizer=str(same)).check_packed_data(qwen3_data)
    assert res.violations == [] and any("files differ but the serialized tokenizers" in n for n in res.notes)

    conf["chat_template"] = conf["chat_template"].replace("<think>", "<reason>")
    (same / "tokenizer_config.json").write_text(json.dumps(conf))
    (v,) = PackingConfig(seq_length=8, tokenizer=str(same)).packed_data_violations(qwen3_data)
    assert v.keys == ("packed_dataset_path", "tokenizer") and "chat template sha256 stored" in v.problem


def test_B23_unloadable_other_name_is_stale_and_says_names_were_compared(qwen3_data):
    for name in ("meta-llama/Meta-Llama-3-8B-Instruct", "Qwen/Qwen3-4B-Instruct-2507"):
        (v,) = PackingConfig(seq_length=8, tokenizer=name).packed_data_violations(qwen3_data)
        assert v.keys == ("packed_dataset_path", "tokenizer")
        assert "compared by name only" in v.problem and "cannot be loaded offline" in v.problem
        assert f"config {name!r}" in v.problem and "stored 'qwen3'" in v.problem


def test_no_stored_tokenizer_is_a_note(tmp_path):
    out = _write(tmp_path / "p")
    res = PackingConfig(seq_length=8, tokenizer="Qwen/Qwen3-8B").check_packed_data(out)
    assert res.violations == [] and any("records no tokenizer; not compared" in n for n in res.notes)
    assert compare_tokenizer("x", None, None, None).same is None


def test_B23_contract_keys_stay_violations_and_user_multiple_is_a_note(tmp_path):
    from seqpack.data import TRAIN_ON
    from seqpack.config.options import TRAIN_ON_VALUES

    assert TRAIN_ON_VALUES == TRAIN_ON
    out = _write(tmp_path / "p", train_on="assistant", pad_to_multiple_of=1, effective_pad_multiple=1)
    (v,) = PackingConfig(seq_length=8, train_on="all").packed_data_violations(out)
    assert v.keys == ("packed_dataset_path", "train_on") and "train_on: stored 'assistant' vs config 'all'" in v.problem
    assert PackingConfig(seq_length=8, train_on="assistant").packed_data_violations(out) == []
    (v,) = PackingConfig(seq_length=16).packed_data_violations(out)
    assert v.keys == ("packed_dataset_path", "capacity")
    # a different user multiple with the same effective multiple is not stale
    out4 = _write(tmp_path / "p4", pad_to_multiple_of=1, context_parallel_size=2, effective_pad_multiple=4)
    cfg = PackingConfig(seq_length=8, pad_to_multiple_of=4, context_parallel_size=2,
                        calculate_per_token_loss=True, average_in_collective=False)
    res = cfg.check_packed_data(out4)
    assert res.violations == [] and any("same effective pad multiple 4" in n for n in res.notes)
    with pytest.raises(ConfigValidationError, match="train_on must be one of assistant, all"):
        PackingConfig.from_dict({"train_on": "assistants"})


def test_check_without_path_and_unreadable(tmp_path):
    res = PackingConfig().check_packed_data()
    assert res.path is None and res.violations == [] and res.notes == []
    (v,) = PackingConfig().packed_data_violations(tmp_path / "missing")
    assert v.rule == "packed_data_unreadable" and "does not exist" in v.problem


def test_B23_stored_hash_of_serialized_tokenizer_matches_local_folder(tmp_path, qwen3_fp):
    """Data packed from a hub id (no local folder: the writer hashed the serialized tokenizer) vs a
    config naming a tokenizer that loads offline and is the same."""
    import hashlib

    from seqpack.config.tokenizers import _load_embedded

    fresh = _load_embedded("qwen3")  # not the shared session fixture, which other tests may configure
    h = hashlib.sha256(fresh.backend_tokenizer.to_str().encode()).hexdigest()
    out = _write(tmp_path / "p", tokenizer="Qwen/Qwen3-8B", tokenizer_hash=h,
                 chat_template_hash=qwen3_fp["chat_template_sha256"])
    res = PackingConfig(seq_length=8, tokenizer="qwen3").check_packed_data(out)
    assert res.violations == [] and any("hash is of the serialized tokenizer" in n for n in res.notes)
