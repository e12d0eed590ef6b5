"""Energon-style hooks: stateless selection and row building, without torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _stream_data import make_samples

import seqpack
from seqpack.stream import pack_selected_samples, select_samples_to_pack


def test_hooks_do_not_import_torch():
    src = os.path.dirname(os.path.dirname(seqpack.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    code = ("import sys, seqpack.stream.hooks, seqpack.stream.buffer, seqpack.stream.source, seqpack.stream; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_energon_hooks_select_and_pack():
    samples = make_samples([300, 200, 100, 400, 50, 250, 120], seed=5)
    groups = select_samples_to_pack(samples, capacity=512, pad_to_multiple_of=4)
    assert sorted(s.sample_id for g in groups for s in g) == sorted(s.sample_id for s in samples)
    for g in groups:
        assert sum(-(-s.length // 4) * 4 for s in g) <= 512
    again = select_samples_to_pack(samples, capacity=512, pad_to_multiple_of=4)
    assert [[s.sample_id for s in g] for g in again] == [[s.sample_id for s in g] for g in groups]
    row = pack_selected_samples(groups[0], pad_token_id=0, pad_to_multiple_of=4)
    row.validate(capacity=512)
    assert row.sample_ids == [s.sample_id for s in groups[0]]
    with pytest.raises(ValueError, match="sample_id 's3'"):
        select_samples_to_pack(samples, capacity=380)
    kept = select_samples_to_pack(samples, capacity=380, overlength="drop")
    assert "s3" not in {s.sample_id for g in kept for s in g}


@pytest.mark.parametrize("bad", [True, 1024.0, "1024", None])
def test_streaming_packer_refuses_a_capacity_that_is_not_an_integer(bad):
    from seqpack.stream import StreamingPacker

    with pytest.raises(ValueError) as e:
        StreamingPacker(make_samples([10, 20]), bad)
    assert str(e.value) == f"capacity must be an integer >= 1, got {bad!r}"
