"""Export to / import from torchtune's packed-sample layout.

torchtune's ``PackedDataset`` yields one dict per pack with ``tokens``, ``labels``, ``input_pos`` and
``seq_lens`` (all ``torch.long``), padded to ``max_seq_len``:

* ``labels`` are **unshifted** (a copy of ``tokens`` with non-trained positions at -100); the recipes
  shift them over the whole row at loss time (``labels[..., 1:]`` followed by one ignore index, e.g.
  ``full_finetune_single_device._loss_step``). So the export writes -100 at every segment's first slot,
  which makes that whole-row shift reproduce seqpack's per-segment shifted labels exactly and never lets
  a label cross into the next segment.
* ``input_pos`` restarts at 0 per sample and keeps counting through padding (same as seqpack's
  ``position_ids``).
* ``seq_lens`` are the segment lengths used to build the block-causal mask; they sum to the row width.
  torchtune puts the row's tail padding in an extra trailing entry; seqpack's last segment absorbs the
  tail (it is only padding, label -100, and causal attention keeps real tokens from seeing it), so the
  export writes the physical segment lengths ``diff(cu_seqlens_padded)``.

torchtune's layout does not record which slots of a segment are alignment padding; pass
``real_seq_lens`` to :func:`from_torchtune` to restore them (lengths are never inferred from token
values).

:func:`packed_dataset` is the dataset builder a torchtune config names as ``dataset._component_``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack._torch import torch_hint
from seqpack.data.tokenizer import TokenizerError, load_tokenizer
from seqpack.packed import PackedSequence, real_boundaries, segment_fields
from seqpack.sample import IGNORE_INDEX, shift_unshifted_labels, unshift_labels

__all__ = ["TorchtunePackedDataset", "from_torchtune", "packed_dataset", "to_torchtune"]


def to_torchtune(pack: Any, *, final_target: str = "error", as_torch: bool = False) -> dict[str, Any]:
    """Convert one seqpack pack to torchtune's packed-sample dict.

    Args:
        pack: a :class:`~seqpack.packed.PackedSequence`.
        final_target: what to do with an explicit final target (case B12) sitting on a segment's last
            physical slot, which unshifted labels cannot hold: ``"error"`` or ``"drop"`` (see
            :func:`seqpack.sample.unshift_labels`). A final target followed by a padding
            slot is stored in that slot and survives.
        as_torch: return ``torch.long`` tensors (as torchtune's ``PackedDataset`` does) instead of numpy.

    Returns:
        ``{"tokens": int64 [T], "labels": int64 [T] (unshifted), "input_pos": int64 [T],
        "seq_lens": int64 [N]}`` with ``sum(seq_lens) == T``.

    Raises:
        ValueError: unrepresentable final target with ``final_target="error"``.
    """
    cu, cup, n = real_boundaries(pack)
    labels = unshift_labels(
        np.asarray(pack.labels), cup, final_target=final_target, sample_ids=getattr(pack, "sample_ids", None)
    )
    out = {
        "tokens": np.asarray(pack.input_ids, dtype=np.int64).copy(),
        "labels": labels,
        "input_pos": np.asarray(pack.position_ids, dtype=np.int64).copy(),
        "seq_lens": np.diff(cup).astype(np.int64),
    }
    if as_torch:
        with torch_hint("seqpack.interop.torchtune.to_torchtune()"):
            import torch

        out = {k: torch.from_numpy(v) for k, v in out.items()}
    return out


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.int64)


def from_torchtune(
    sample: dict[str, Any],
    *,
    real_seq_lens: Any = None,
    trailing_padding: bool = False,
    sample_ids: list[str] | None = None,
    where: str = "pack",
):
    """Convert one torchtune packed-sample dict back into a seqpack pack.

    Args:
        sample: dict with ``tokens``, ``labels`` (unshifted), ``seq_lens`` (torch tensors or arrays);
            ``input_pos`` is not needed (positions are rebuilt from the boundaries).
        real_seq_lens: optional int [N] real lengths of the segments (``pack.seq_lens`` of the exported
            pack); default: each segment is entirely real.
        trailing_padding: the last ``seq_lens`` entry is torchtune's tail-padding entry (as written by
            ``PackedDataset`` when the pack is not full): merge it into the previous segment as tail.
        sample_ids: optional ids (default ``"{where}#seg{i}"``).
        where: name of the pack for error messages.

    Returns:
        :class:`~seqpack.packed.PackedSequence`.

    Raises:
        ValueError: ``sum(seq_lens) != len(tokens)``, a zero length, or ``real_seq_lens`` out of range.
    """
    tokens = _np(sample["tokens"])
    hf = _np(sample["labels"])
    lens = _np(sample["seq_lens"])
    T = tokens.shape[0]
    if hf.shape[0] != T:
        raise ValueError(f"{where}: labels has {hf.shape[0]} entries, tokens {T}")
    if trailing_padding:
        if lens.size < 2:
            raise ValueError(f"{where}: trailing_padding=True needs at least 2 seq_lens entries, got {lens.tolist()}")
        lens = np.concatenate([lens[:-2], [lens[-2] + lens[-1]]])
    if int(lens.sum()) != T or np.any(lens < 1):
        raise ValueError(f"{where}: seq_lens {lens.tolist()[:8]} must be >= 1 and sum to len(tokens) = {T}")
    cup = np.concatenate([[0], np.cumsum(lens)])
    if real_seq_lens is None:
        real = lens.copy()
    else:
        real = _np(real_seq_lens)
        if real.shape != lens.shape or np.any(real < 1) or np.any(real > lens):
            raise ValueError(
                f"{where}: real_seq_lens {real.tolist()[:8]} do not fit seq_lens {lens.tolist()[:8]}"
            )
    cu = np.concatenate([[0], np.cumsum(real)])
    labels = shift_unshifted_labels(hf, cup)
    labels[segment_fields(cup, real)[1]] = IGNORE_INDEX  # padding slots are never labelled
    if sample_ids is None:
        sample_ids = [f"{where}#seg{i}" for i in range(lens.size)]
    return PackedSequence.from_boundaries(
        tokens, labels, cu.astype(np.int32), cup.astype(np.int32), sample_ids=list(sample_ids)
    )


class TorchtunePackedDataset:
    """A seqpack packed dataset seen as torchtune's ``PackedDataset``: ``ds[i]`` is the dict of
    :func:`to_torchtune` (``torch.long`` tensors) padded to ``max_seq_len`` the way torchtune pads a pack
    (``torchtune.datasets.PackedDataset._pad_pack``): ``tokens`` with ``padding_idx``, ``labels`` with -100,
    ``input_pos`` counting on from the last position (clamped to ``max_seq_len - 1``) and one extra
    ``seq_lens`` entry for the padding, so every row is ``max_seq_len`` wide and
    ``torchtune.data.padded_collate_packed`` stacks them.

    Attributes:
        packs: the seqpack :class:`~seqpack.io.PackedDataset`.
        max_seq_len: row width (the packed data's ``seq_length``).
        padding_idx: token id of the added padding (the data's ``pad_token_id``).
        packed: ``True`` (torchtune's recipes read ``cfg.dataset.packed`` to choose the collate function).
    """

    packed = True

    def __init__(self, packs: Any, *, max_seq_len: int, padding_idx: int, final_target: str = "error") -> None:
        self.packs = packs
        self.max_seq_len = int(max_seq_len)
        self.padding_idx = int(padding_idx)
        self.final_target = final_target

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        with torch_hint("seqpack.interop.torchtune.TorchtunePackedDataset"):
            import torch

        out = to_torchtune(self.packs[i], final_target=self.final_target)
        pad = self.max_seq_len - out["tokens"].shape[0]
        if pad < 0:
            raise ValueError(f"pack {i} has {out['tokens'].shape[0]} tokens, more than max_seq_len={self.max_seq_len}")
        if pad:
            last = int(out["input_pos"][-1])
            out = {
                "tokens": np.concatenate([out["tokens"], np.full(pad, self.padding_idx, np.int64)]),
                "labels": np.concatenate([out["labels"], np.full(pad, IGNORE_INDEX, np.int64)]),
                "input_pos": np.concatenate(
                    [out["input_pos"], np.minimum(np.arange(last + 1, last + 1 + pad), self.max_seq_len - 1)]
                ),
                "seq_lens": np.concatenate([out["seq_lens"], [pad]]).astype(np.int64),
            }
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def packed_dataset(
    tokenizer: Any = None,
    *,
    source: str,
    packed: bool = True,
    max_seq_len: int | None = None,
    expect: dict[str, Any] | None = None,
    final_target: str = "error",
    check_tokenizer: bool = True,
) -> TorchtunePackedDataset:
    """torchtune dataset builder over a seqpack packed dataset (made by ``seqpack pack``).

    Name it in a torchtune config; ``torchtune.config.instantiate(cfg.dataset, tokenizer)`` calls it with
    the recipe's tokenizer as the first argument::

        dataset:
          _component_: seqpack.interop.torchtune.packed_dataset
          source: packed/
          packed: True

    Token ids come from the packed data (tokenized by ``seqpack pack --tokenizer``, recorded in its
    ``metadata.json``); the recipe's ``tokenizer`` only has to agree with it: with ``check_tokenizer``
    a probe text is encoded by both (``tokenizer.encode(text, add_bos=False, add_eos=False)``, the
    torchtune tokenizer signature, vs. the data's tokenizer loaded by ``seqpack.data.load_tokenizer``).

    Args:
        tokenizer: the recipe's tokenizer (``None`` or an object without ``encode``: not checked).
        source: the packed dataset directory.
        packed: must be ``True``: torchtune's recipes then collate with ``padded_collate_packed``
            (block-causal mask from ``seq_lens``); ``False`` would make them pad and collate the packs as
            single sequences, attending across samples.
        max_seq_len: row width; default and upper bound the data's ``seq_length`` (torchtune's
            ``tokenizer.max_seq_len`` is the usual value to pass).
        expect: settings checked against ``metadata.json`` (``seqpack.io.load_packed(expect=...)``).
        final_target: as :func:`to_torchtune`.
        check_tokenizer: compare ``tokenizer`` with the data's tokenizer (above).

    Returns:
        :class:`TorchtunePackedDataset` (rows: ``tokens``, ``labels``, ``input_pos``, ``seq_lens``,
        ``torch.long``, ``max_seq_len`` wide).

    Raises:
        ValueError: ``packed`` is not True; ``max_seq_len`` smaller than the data's ``seq_length``; the
            recipe's tokenizer encodes the probe differently from the data's (or the data's cannot be loaded).
        FileNotFoundError / ValueError: from ``load_packed`` (missing dataset, ``expect`` mismatch).
    """
    from seqpack.io import load_packed

    if packed is not True:
        raise ValueError(
            f"packed={packed!r}: seqpack.interop.torchtune.packed_dataset yields packed rows; set `packed: True` in "
            "the dataset config so the recipe collates them with padded_collate_packed (a block-causal mask per "
            "sample) instead of padding them as single sequences"
        )
    packs = load_packed(source, expect=expect)
    cap = int(packs.metadata.seq_length)
    width = cap if max_seq_len is None else int(max_seq_len)
    if width < cap:
        raise ValueError(
            f"max_seq_len={width} is smaller than the packed data's seq_length={cap} ({source}); pass "
            f"max_seq_len >= {cap} or re-pack with --seq-length {width}"
        )
    if check_tokenizer and callable(getattr(tokenizer, "encode", None)):
        _check_tokenizer(tokenizer, packs.metadata.tokenizer, source)
    pad_id = packs.metadata.pad_token_id
    return TorchtunePackedDataset(packs, max_seq_len=width, padding_idx=0 if pad_id is None else int(pad_id),
                                  final_target=final_target)


_PROBE = "seqpack probe: Hello, world! 1234 ünïcödé\n\tdef f(x): return x ** 2"


def _check_tokenizer(tokenizer: Any, name: str | None, source: Any) -> None:
    """Refuse a recipe tokenizer that encodes :data:`_PROBE` differently from the packed data's tokenizer."""
    fix = "use the tokenizer the data was packed with, re-pack with the recipe's (seqpack pack --tokenizer), " \
          "or pass check_tokenizer: False"
    try:
        ours = load_tokenizer(name).encode(_PROBE, add_special_tokens=False)
    except (TokenizerError, OSError, ValueError) as e:
        raise ValueError(f"{source}: cannot load the data's tokenizer {name!r} to compare with the recipe's ({e}); "
                         f"{fix}") from None
    theirs = list(tokenizer.encode(_PROBE, add_bos=False, add_eos=False))
    if theirs != list(ours):
        raise ValueError(
            f"{source}: the recipe's tokenizer ({type(tokenizer).__name__}) encodes a probe text as {theirs[:8]}..., "
            f"the data's tokenizer {name!r} as {list(ours)[:8]}...: the token ids would not mean what the model "
            f"expects; {fix}"
        )
