"""The ``seqpack`` command runs Arrow on the C library's allocator (``ARROW_DEFAULT_MEMORY_POOL=system``)
unless the user chose a pool; the allocator does not change the bytes written."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqpack.cli.allocator import ARROW_POOL_ENV, prefer_system_allocator

SRC = Path(__file__).resolve().parents[2] / "src"

_POOL_AFTER_MAIN = """
from seqpack.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
import pyarrow as pa
print("POOL=" + pa.default_memory_pool().backend_name)
"""

_WRITE = """
import sys
import numpy as np
import pyarrow as pa
from seqpack.io import PackedMetadata, write_packed
from seqpack.packed import build_packed_sequence
from seqpack.sample import Sample, shift_labels
rng = np.random.default_rng(0)
rows = []
for k in range(40):  # long packs in one row group, as a long record split into 4,096-token fragments
    ids = rng.integers(0, 150_000, 4096).astype(np.int32)
    s = Sample(ids, shift_labels(ids, np.arange(4096) > 0), sample_id=f"r#part{k}", source="hand", index=0)
    rows.append(build_packed_sequence([s], pad_to_multiple_of=1, pad_token_id=0, seq_length=4096))
meta = PackedMetadata(seq_length=4096, pad_to_multiple_of=1, context_parallel_size=1, effective_pad_multiple=1,
                      algorithm="first_fit_decreasing", tokenizer_hash="abc", pad_token_id=0)
write_packed(rows, sys.argv[1], meta)
print("POOL=" + pa.default_memory_pool().backend_name)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ARROW_POOL_ENV}
    return {**env, "PYTHONPATH": str(SRC), **extra}


def _pool_line(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("POOL=")][-1]


def test_prefer_system_allocator_sets_the_variable_only_when_unset_and_pyarrow_not_imported():
    env: dict[str, str] = {}
    assert prefer_system_allocator(env, modules={}) is True and env == {ARROW_POOL_ENV: "system"}
    chosen = {ARROW_POOL_ENV: "mimalloc"}
    assert prefer_system_allocator(chosen, modules={}) is False and chosen == {ARROW_POOL_ENV: "mimalloc"}
    empty = {ARROW_POOL_ENV: ""}
    assert prefer_system_allocator(empty, modules={}) is False and empty == {ARROW_POOL_ENV: ""}
    late: dict[str, str] = {}
    assert prefer_system_allocator(late, modules={"pyarrow": object()}) is False and late == {}


@pytest.mark.parametrize("chosen, expected", [(None, "system"), ("mimalloc", "mimalloc")])
def test_the_command_line_process_uses_the_system_pool_unless_the_user_chose_one(chosen, expected):
    env = _env(**({ARROW_POOL_ENV: chosen} if chosen else {}))
    res = subprocess.run([sys.executable, "-c", _POOL_AFTER_MAIN], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert _pool_line(res.stdout) == f"POOL={expected}"


def test_the_shards_written_are_byte_identical_under_either_pool(tmp_path):
    digests = {}
    for pool in ("system", "mimalloc"):
        out = tmp_path / pool
        res = subprocess.run([sys.executable, "-c", _WRITE, str(out)], capture_output=True, text=True,
                             env=_env(**{ARROW_POOL_ENV: pool}), timeout=120)
        assert res.returncode == 0, res.stderr
        assert _pool_line(res.stdout) == f"POOL={pool}"
        digests[pool] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()}
    assert set(digests["system"]) == {"shard-00000.parquet", "metadata.json", "report.jsonl"}
    assert digests["system"] == digests["mimalloc"]
