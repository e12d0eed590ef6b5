"""seqpack.adapters.to_megatron against the installed megatron-core (``pip install --no-deps megatron-core``).

Checks the real ``PackedSeqParams`` field by field, and seqpack's context-parallel partition against
megatron-core's own pure-torch CP code (THD RoPE per-rank slicing and ``get_batch_on_this_cp_rank``).
Transformer Engine's ``thd_get_partitioned_indices`` and a packed ``GPTModel.forward`` need CUDA + TE:
megatron-core's only THD attention is TE's (its local ``DotProductAttention`` asserts
``packed_seq_params is None``), so neither runs here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from _models import random_samples

from seqpack.adapters import PackedSeqParamsLike, to_megatron
from seqpack.adapters import megatron as megatron_adapter
from seqpack.packed import build_packed_sequence
from seqpack.parallel import cp_partition_indices, slice_for_cp

#: megatron-core 0.19's PackedSeqParams fields, in order (the newest release: the stand-in mirrors it).
MCORE_019_FIELDS = (
    "qkv_format", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded",
    "max_seqlen_q", "max_seqlen_kv", "local_cp_size", "cp_group", "total_tokens", "seq_idx",
    "tokens_per_sample", "pad_between_seqs",
)


def _row():
    # lengths 5 and 3, multiple 4, width 16: cu [0,5,8], cu_padded [0,8,16] (the tail joins segment 1)
    return build_packed_sequence(random_samples((5, 3), vocab=1000, seed=0, prefix="doc"), pad_to_multiple_of=4,
                                 pad_token_id=0, seq_length=16, pad_to_max_length=True)


#: every field seqpack fills for _row(), with its expected value; fields left at their default map to None
EXPECTED = {
    "qkv_format": "thd",
    "cu_seqlens_q": [0, 5, 8],
    "cu_seqlens_kv": [0, 5, 8],
    "cu_seqlens_q_padded": [0, 8, 16],
    "cu_seqlens_kv_padded": [0, 8, 16],
    "max_seqlen_q": 8,
    "max_seqlen_kv": 8,
    "local_cp_size": None,
    "cp_group": None,
    "total_tokens": 16,
    "seq_idx": [[0] * 8 + [1] * 8],
    "tokens_per_sample": None,
    "pad_between_seqs": True,
}


def _check_fields(p, names):
    for name in names:
        assert name in EXPECTED, f"PackedSeqParams has field {name!r} that seqpack does not know"
        v, want = getattr(p, name), EXPECTED[name]
        if isinstance(v, torch.Tensor):
            assert v.dtype == torch.int32, name
            assert v.tolist() == want, name
        else:
            assert v == want and type(v) is type(want), (name, v)


def test_real_packed_seq_params_every_field():
    pytest.importorskip("megatron.core", reason="megatron-core not installed (.ci/run installs it)")
    from megatron.core.packed_seq_params import PackedSeqParams

    p = to_megatron(_row(), as_dataclass=True)["packed_seq_params"]
    assert type(p) is PackedSeqParams
    names = [f.name for f in dataclasses.fields(PackedSeqParams)]
    _check_fields(p, names)
    # the dict form carries the same values (plus the fields this megatron-core version lacks)
    d = to_megatron(_row())["packed_seq_params"]
    for name in names:
        if name in d:
            got = d[name].tolist() if isinstance(d[name], torch.Tensor) else d[name]
            assert got == EXPECTED[name], name


def test_standin_when_megatron_core_absent(monkeypatch):
    assert tuple(f.name for f in dataclasses.fields(PackedSeqParamsLike)) == MCORE_019_FIELDS
    real_find_spec = megatron_adapter.importlib.util.find_spec
    monkeypatch.setattr(megatron_adapter.importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("megatron") else real_find_spec(name, *a))
    p = to_megatron(_row(), as_dataclass=True)["packed_seq_params"]
    assert type(p) is PackedSeqParamsLike
    _check_fields(p, MCORE_019_FIELDS)


def test_seq_idx_matches_megatron_post_init_where_it_computes_it():
    """megatron-core >= 0.17 derives seq_idx from total_tokens in __post_init__; seqpack's value equals it."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed (.ci/run installs it)")
    from megatron.core.packed_seq_params import PackedSeqParams

    if "total_tokens" not in {f.name for f in dataclasses.fields(PackedSeqParams)}:
        pytest.skip("this megatron-core has no total_tokens / seq_idx fields (added after 0.16)")
    d = to_megatron(_row())["packed_seq_params"]
    theirs = PackedSeqParams(qkv_format="thd", cu_seqlens_q=d["cu_seqlens_q"], cu_seqlens_q_padded=d["cu_seqlens_q_padded"],
                             total_tokens=d["total_tokens"])
    assert torch.equal(theirs.seq_idx, d["seq_idx"])


class _CPGroup:
    """What megatron-core's THD RoPE reads from its context-parallel process group: size() and rank()."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_partition_equals_megatron_thd_rope_slicing(cp):
    """Megatron-core's THD CP RoPE (`_apply_rotary_pos_emb_thd`, pure torch) takes each rank's tokens to be
    chunks r and 2cp-1-r of every segment; seqpack's cp slice must hold exactly those tokens, so rotating the
    rank's slice with Megatron equals rotating each token by seqpack's own position id."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed (.ci/run installs it)")
    from megatron.core.models.common.embeddings import rope_utils

    m = 4 * cp
    row = build_packed_sequence(random_samples((13, 30, 7, 21), vocab=1000, seed=1, prefix="d"), pad_to_multiple_of=m,
                                pad_token_id=0, seq_length=96, pad_to_max_length=True)
    full = row.to_torch()
    cup = torch.as_tensor(row.cu_seqlens_padded, dtype=torch.int32)
    T = int(cup[-1])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, 2, 8, generator=g)  # [t, heads, head_dim]
    freqs = torch.randn(int(np.diff(row.cu_seqlens_padded).max()) + 1, 1, 1, 8, generator=g)  # [max_s, 1, 1, d]
    seen = []
    for r in range(cp):
        idx = cp_partition_indices(row.cu_seqlens_padded, cp, r)
        # indices: megatron's per-segment rank slicing of the global positions (its offset mode)
        theirs = torch.cat([
            rope_utils._get_thd_freqs_on_this_cp_rank(r, cp, x[: (int(b) - int(a)) // cp], torch.arange(T), int(a))
            for a, b in zip(cup[:-1], cup[1:])
        ])
        assert theirs.tolist() == idx.tolist()
        # values: megatron's THD CP RoPE on the rank's slice == RoPE at seqpack's sliced position ids
        local = slice_for_cp(full, cp, r)
        assert torch.equal(local["input_ids"], full["input_ids"][torch.as_tensor(idx)])
        p = to_megatron(local)["packed_seq_params"]
        out = rope_utils._apply_rotary_pos_emb_thd(x[idx], p["cu_seqlens_q_padded"], freqs, cp_group=_CPGroup(cp, r))
        ref = rope_utils._apply_rotary_pos_emb_bshd(x[idx].unsqueeze(1), freqs[local["position_ids"]]).squeeze(1)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        seen.append(idx)
    assert sorted(np.concatenate(seen).tolist()) == list(range(T))


@pytest.mark.parametrize("cp", [2, 3])
def test_cp_partition_one_segment_equals_get_batch_on_this_cp_rank(cp, monkeypatch):
    """For a row of one segment, THD and BSHD CP agree; megatron-core's `get_batch_on_this_cp_rank`
    (pure torch, the BSHD path) gives the same tokens per rank as seqpack's partition."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed (.ci/run installs it)")
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    T = 2 * cp * 5
    tokens = torch.arange(100, 100 + T).unsqueeze(0)
    for r in range(cp):
        monkeypatch.setattr(parallel_state, "get_context_parallel_world_size", lambda: cp)
        monkeypatch.setattr(parallel_state, "get_context_parallel_rank", lambda r=r: r)
        theirs = get_batch_on_this_cp_rank({"tokens": tokens.clone(), "labels": tokens.clone() + 1})
        idx = torch.as_tensor(cp_partition_indices(np.array([0, T]), cp, r))
        assert torch.equal(theirs["tokens"][0], tokens[0, idx])
        assert torch.equal(theirs["labels"][0], tokens[0, idx] + 1)
