"""Export to / import from a Hugging Face ``datasets.Dataset`` (one row per pack).

Columns (Arrow types): ``input_ids`` list<int32>, ``labels`` list<int32>, ``position_ids`` list<int32>,
``cu_seqlens`` list<int32>, ``cu_seqlens_padded`` list<int32>, ``seq_lens`` list<int32>,
``sample_ids`` list<string>. Boundary arrays are kept so a trainer can feed flash-attention varlen
(``cu_seq_lens_q = cu_seqlens``) or rebuild the THD row with :func:`from_hf_dataset`.

``label_convention="shifted"`` (default) stores seqpack's per-segment shifted labels; ``"unshifted"``
stores HF-collator labels (``hf[t] = labels[t-1]``, -100 at each segment's first slot), the form HF
``Trainer`` models expect, since they shift inside the loss.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from seqpack.packed import PackedSequence, real_boundaries, segment_fields
from seqpack.sample import IGNORE_INDEX, shift_unshifted_labels, unshift_labels

__all__ = ["HF_COLUMNS", "to_hf_dataset", "from_hf_dataset"]

HF_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "cu_seqlens_padded", "seq_lens", "sample_ids")
_CONVENTIONS = ("shifted", "unshifted")


def _features():
    from datasets import Features, Sequence, Value

    i32 = Sequence(Value("int32"))
    return Features(
        {
            "input_ids": i32,
            "labels": i32,
            "position_ids": i32,
            "cu_seqlens": i32,
            "cu_seqlens_padded": i32,
            "seq_lens": i32,
            "sample_ids": Sequence(Value("string")),
        }
    )


def to_hf_dataset(
    packs: Iterable[Any],
    *,
    label_convention: str = "shifted",
    final_target: str = "error",
    batch_rows: int = 1024,
):
    """Build an in-memory (Arrow-backed) ``datasets.Dataset`` with one row per pack.

    Args:
        packs: iterable of :class:`~seqpack.packed.PackedSequence` (a seqpack ``PackedDataset`` works).
        label_convention: ``"shifted"`` (seqpack) or ``"unshifted"`` (HF collators); see module docstring.
        final_target: for ``"unshifted"`` only: ``"error"`` or ``"drop"`` for a final target on a
            segment's last physical slot (case B12; see :func:`seqpack.sample.unshift_labels`).
        batch_rows: packs converted per Arrow record batch (bounds the Python-list overhead).

    Returns:
        ``datasets.Dataset`` with columns :data:`HF_COLUMNS` and ``info.description`` naming the label
        convention.

    Raises:
        ValueError: unknown convention; unrepresentable final target.
    """
    import datasets
    import pyarrow as pa

    if label_convention not in _CONVENTIONS:
        raise ValueError(f"label_convention must be one of {_CONVENTIONS}, got {label_convention!r}")
    features = _features()
    schema = features.arrow_schema
    batches = []
    buf: dict[str, list] = {c: [] for c in HF_COLUMNS}

    def flush():
        if buf["input_ids"]:
            batches.append(pa.RecordBatch.from_pydict(buf, schema=schema))
            for c in HF_COLUMNS:
                buf[c] = []

    for pack in packs:
        cu, cup, n = real_boundaries(pack)
        sids = [str(s) for s in (pack.sample_ids or [])]
        lab = np.asarray(pack.labels)
        if label_convention == "unshifted":
            lab = unshift_labels(lab, cup, final_target=final_target, sample_ids=sids)
        buf["input_ids"].append(np.asarray(pack.input_ids, dtype=np.int32))
        buf["labels"].append(np.asarray(lab, dtype=np.int32))
        buf["position_ids"].append(np.asarray(pack.position_ids, dtype=np.int32))
        buf["cu_seqlens"].append(cu.astype(np.int32))
        buf["cu_seqlens_padded"].append(cup.astype(np.int32))
        buf["seq_lens"].append(np.diff(cu).astype(np.int32))
        buf["sample_ids"].append(sids)
        if len(buf["input_ids"]) >= batch_rows:
            flush()
    flush()
    table = pa.Table.from_batches(batches, schema=schema)
    info = datasets.DatasetInfo(
        description=f"seqpack packs; labels: {label_convention} "
        + ("(per segment, labels[t] = target of logit t)" if label_convention == "shifted" else "(HF collator)"),
        features=features,
    )
    return datasets.Dataset(table, info=info)


def from_hf_dataset(dataset: Any, *, label_convention: str = "shifted") -> list:
    """Rebuild seqpack packs from a dataset made by :func:`to_hf_dataset` (or with the same columns).

    Args:
        dataset: ``datasets.Dataset`` (or any sequence of dicts) with ``input_ids``, ``labels``,
            ``cu_seqlens``, ``cu_seqlens_padded`` and optionally ``sample_ids``.
        label_convention: how ``labels`` are stored (``"shifted"`` or ``"unshifted"``).

    Returns:
        list of :class:`~seqpack.packed.PackedSequence` (every derived field rebuilt from the boundaries).

    Raises:
        ValueError: unknown convention; KeyError naming a missing column.
    """
    if label_convention not in _CONVENTIONS:
        raise ValueError(f"label_convention must be one of {_CONVENTIONS}, got {label_convention!r}")
    cols = getattr(dataset, "column_names", None)
    if cols is not None:
        missing = [c for c in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded") if c not in cols]
        if missing:
            raise KeyError(f"from_hf_dataset: dataset lacks column(s) {missing}; it has {cols}")
        rows = dataset.with_format("numpy") if hasattr(dataset, "with_format") else dataset
    else:
        rows = dataset
    out = []
    for i, r in enumerate(rows):
        cup = np.asarray(r["cu_seqlens_padded"], dtype=np.int32)
        lab = np.asarray(r["labels"], dtype=np.int64)
        if label_convention == "unshifted":
            lab = shift_unshifted_labels(lab, cup)
            # slots past a segment's real length are padding: never labelled
            real = np.diff(np.asarray(r["cu_seqlens"], dtype=np.int64))
            lab[segment_fields(cup, real)[1]] = IGNORE_INDEX
        sids = r.get("sample_ids") if hasattr(r, "get") else None
        sids = [str(s) for s in sids] if sids is not None else [f"row{i}#seg{k}" for k in range(len(cup) - 1)]
        out.append(
            PackedSequence.from_boundaries(
                np.asarray(r["input_ids"], dtype=np.int64),
                lab,
                np.asarray(r["cu_seqlens"], dtype=np.int32),
                cup,
                sample_ids=sids,
            )
        )
    return out
