"""In-batch packing: a micro-batch of unpacked samples -> one THD row at collate time."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from seqpack.collate.output import (
    check_format,
    check_label_convention,
    feature_sample,
    format_batch,
    row_batch,
)
from seqpack.packed import build_packed_sequence
from seqpack.padding import check_seq_length, compute_pad_multiple
from seqpack.sample import IGNORE_INDEX

__all__ = ["InBatchPackingCollator"]


class InBatchPackingCollator:
    """Pack a micro-batch of unpacked samples into one THD row at collate time.

    Each sample becomes a segment padded to ``round_up(len, multiple)`` (``multiple`` from
    ``compute_pad_multiple``, see ``context_parallel_size``); labels stay
    shifted per sample so none crosses a boundary (B03); positions restart per segment.

    Args:
        pad_token_id: id written into padding slots (never used to find lengths).
        pad_to_multiple_of: user per-segment multiple (>= 1).
        context_parallel_size: CP size; the multiple actually used is
            ``seqpack.padding.compute_pad_multiple(pad_to_multiple_of, context_parallel_size)``
            (``lcm`` with ``2*CP``, Transformer Engine's THD CP rule), the one source of truth.
        seq_length: optional capacity; a micro-batch whose padded total exceeds it raises.
        force_to_pad_to_seq_len: pad the row to exactly ``seq_length`` with the tail as its own
            empty segment (module docstring; Megatron-Bridge's VLM layout). Requires ``seq_length``
            divisible by ``pad_to_multiple_of``.
        format, config, attn_implementation, mask_dtype: as in :class:`PackedCollator` (``format="hf"``
            needs ``config=model.config``).
        label_convention: ``"shifted"`` (``Sample``) or ``"hf"`` (mapping features with HF labels).
            With ``"shifted"``, a micro-batch whose labels equal ``input_ids`` on every trained slot
            triggers one ``UserWarning`` per collator (HF-style labels passed by mistake).

    Raises:
        ValueError: bad settings (naming the key), an empty sample, or an over-full micro-batch
            (naming sample ids and lengths).
    """

    def __init__(self, pad_token_id: int, *, pad_to_multiple_of: int = 1, seq_length: int | None = None,
                 force_to_pad_to_seq_len: bool = False, format: str = "thd", config: Any = None,
                 attn_implementation: str | None = None, mask_dtype=None, label_convention: str = "shifted",
                 context_parallel_size: int = 1):
        check_format(format, attn_implementation, config)
        m = compute_pad_multiple(pad_to_multiple_of, context_parallel_size)
        if force_to_pad_to_seq_len and seq_length is None:
            raise ValueError("force_to_pad_to_seq_len=True needs seq_length")
        if seq_length is not None:
            check_seq_length(seq_length, m, {"pad_to_multiple_of": pad_to_multiple_of,
                                             "context_parallel_size": context_parallel_size})
        check_label_convention(label_convention)
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = m
        self.seq_length = seq_length
        self.force_to_pad_to_seq_len = bool(force_to_pad_to_seq_len)
        self.format = format
        self.config = config
        self.attn_implementation = attn_implementation
        self.mask_dtype = mask_dtype
        self.label_convention = label_convention
        self._warned_unshifted = False

    def _check_unshifted(self, samples) -> None:
        """Warn once when ``label_convention="shifted"`` labels look HF-style (``labels == input_ids`` on
        every trained slot of the micro-batch, at least 2 of them): training would then learn to copy
        the current token instead of predicting the next one."""
        if self._warned_unshifted or self.label_convention != "shifted":
            return
        n = same = 0
        for s in samples:
            m = s.labels != IGNORE_INDEX
            n += int(m.sum())
            same += int((s.labels[m] == s.input_ids[m]).sum())
        if n >= 2 and same == n:
            self._warned_unshifted = True
            warnings.warn(
                f"InBatchPackingCollator: labels equal input_ids on all {n} trained slots of this micro-batch "
                "(sample ids " + ", ".join(s.sample_id for s in samples[:3]) + "): they look like HF-style "
                "unshifted labels, but label_convention='shifted' expects labels[t] = input_ids[t+1]. Pass "
                "label_convention='hf' (or build Samples with seqpack.sample.shift_labels).",
                UserWarning, stacklevel=3)

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        if len(features) == 0:
            raise ValueError("InBatchPackingCollator got an empty batch")
        samples = [feature_sample(f, self.label_convention, i) for i, f in enumerate(features)]
        self._check_unshifted(samples)
        row = build_packed_sequence(
            samples, pad_to_multiple_of=self.pad_to_multiple_of, pad_token_id=self.pad_token_id,
            seq_length=self.seq_length, pad_to_max_length=self.force_to_pad_to_seq_len, tail_segment=True,
        )
        return format_batch(row_batch(row), self.format, self.attn_implementation, self.mask_dtype, self.config)
