"""Export to / import from a Hugging Face ``datasets.Dataset`` (one row per pack), in the columns HF
``Trainer`` and TRL's ``SFTTrainer`` read.

Columns (Arrow ``list<int32>`` unless noted), ``T`` slots and ``N`` segments per row:

* ``input_ids`` [T].
* ``labels`` [T]: **unshifted** (HF convention, the model shifts inside its loss): ``labels[t]`` is the
  target of the logit at ``t - 1``; -100 at every segment's first slot, so no segment learns from the
  one before it. TRL's ``DataCollatorForLanguageModeling`` and HF models read this column.
* ``shift_labels`` [T]: seqpack's per-segment shifted labels (``shift_labels[t]`` = target of the
  logit at ``t``), the exact form (it also holds a final target on a segment's last physical slot).
  The name and meaning are transformers' (``ForCausalLMLoss(shift_labels=...)``) and TRL's fused LM
  head's; :class:`seqpack.collate.PackedCollator` and :func:`from_hf_dataset` read it.
* ``seq_lengths`` [N]: **physical** segment lengths (``diff(cu_seqlens_padded)``, summing to ``T``).
  TRL's padding-free collator (``DataCollatorForLanguageModeling(padding_free=True)``, TRL 1.x) rebuilds
  ``position_ids`` (restarting at 0 per entry) and ``cu_seq_lens_q/k`` from this column, so with
  physical lengths they equal seqpack's (positions keep counting through alignment padding). A row
  given to TRL without it is read as ONE sequence: TRL cannot tell, so keep the column.
* ``position_ids`` [T], ``cu_seqlens`` [N+1] (logical), ``cu_seqlens_padded`` [N+1] (physical),
  ``sample_ids`` list<string> [N]: the THD row (:func:`from_hf_dataset` rebuilds it).

Text rows only: a pack with media or M-RoPE tables is refused (TRL's padding-free mode does not
take vision rows, and the columns have no place for pixels).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from seqpack.packed import PackedSequence, real_boundaries, segment_fields
from seqpack.sample import IGNORE_INDEX, shift_unshifted_labels, unshift_labels

__all__ = ["HF_COLUMNS", "TRL_COLUMNS", "from_hf_dataset", "to_hf_dataset"]

HF_COLUMNS = ("input_ids", "labels", "shift_labels", "position_ids", "seq_lengths", "cu_seqlens",
              "cu_seqlens_padded", "sample_ids")
#: The columns TRL 1.x's ``DataCollatorForLanguageModeling`` reads (``padding_free=True``).
TRL_COLUMNS = ("input_ids", "labels", "seq_lengths")
_BOUNDARY_COLUMNS = ("input_ids", "cu_seqlens", "cu_seqlens_padded")


def _features():
    from datasets import Features, Sequence, Value

    cols = {c: Sequence(Value("int32")) for c in HF_COLUMNS}
    cols["sample_ids"] = Sequence(Value("string"))
    return Features(cols)


def _where(index: int, sids: list[str]) -> str:
    return f"pack {index}" + (f" (samples {sids[:3]}{'...' if len(sids) > 3 else ''})" if sids else "")


def _row(pack: Any, index: int, final_target: str) -> dict[str, Any]:
    """The columns of one pack (module docstring); raises ValueError for what they cannot hold."""
    cu, cup, _ = real_boundaries(pack)
    sids = [str(s) for s in (pack.sample_ids or [])]
    where = _where(index, sids)
    media = getattr(pack, "media", None)
    extra = getattr(pack, "extra", None) or {}
    if (media is not None and any(m for m in media)) or extra.get("mrope_position_ids") is not None:
        raise ValueError(
            f"{where} carries media / M-RoPE positions: the HF-datasets export holds text rows only (TRL's "
            "padding-free mode takes no vision rows). Train image packs with seqpack.collate.PackedCollator "
            "(format='hf') over seqpack.io.load_packed(path, load_media=True).")
    ids = np.asarray(pack.input_ids)
    phys = np.diff(cup)
    if phys.size == 0 or (phys < 1).any() or int(cup[-1]) != ids.shape[0]:
        raise ValueError(f"{where}: physical lengths {phys.tolist()[:8]} must be >= 1 and sum to the row "
                         f"width {ids.shape[0]}")
    positions, _, _ = segment_fields(cup, np.diff(cu))
    if not np.array_equal(np.asarray(pack.position_ids), positions):
        raise ValueError(f"{where}: position_ids do not restart at 0 on each physical segment start, so the "
                         "positions TRL rebuilds from seq_lengths would differ from the row's")
    shifted = np.asarray(pack.labels)
    try:
        unshifted = unshift_labels(shifted, cup, final_target=final_target, sample_ids=sids)
    except ValueError as exc:
        raise ValueError(f"to_hf_dataset, {where}: {exc} TRL's collator and HF models read the unshifted "
                         "'labels' column; 'shift_labels' (read by seqpack's PackedCollator) keeps the target "
                         "either way.") from None
    return {
        "input_ids": ids.astype(np.int32),
        "labels": unshifted.astype(np.int32),
        "shift_labels": shifted.astype(np.int32),
        "position_ids": positions.astype(np.int32),
        "seq_lengths": phys.astype(np.int32),
        "cu_seqlens": cu.astype(np.int32),
        "cu_seqlens_padded": cup.astype(np.int32),
        "sample_ids": sids,
    }


def to_hf_dataset(packs: Iterable[Any], *, final_target: str = "error", batch_rows: int = 1024):
    """Build an in-memory (Arrow-backed) ``datasets.Dataset`` with one row per pack.

    The result trains as it is with TRL's ``SFTTrainer`` (``padding_free=True``, ``max_length=None``,
    ``dataset_kwargs={"skip_prepare_dataset": True}``: TRL's collator reads :data:`TRL_COLUMNS`), with
    ``transformers.Trainer`` or ``SFTTrainer`` plus ``seqpack.collate.PackedCollator(format="hf", ...)`` and
    ``remove_unused_columns=False`` (the collator reads the boundary columns, which the trainers drop
    otherwise), and reads back with :func:`from_hf_dataset`.

    Args:
        packs: iterable of :class:`~seqpack.packed.PackedSequence` (a seqpack ``PackedDataset`` works).
        final_target: a target on a segment's last physical slot (an explicit final target with no padding
            slot after it, case B12) has no place in the unshifted ``labels``: ``"error"`` refuses the
            export, ``"drop"`` leaves it out of ``labels`` (trainers reading ``labels`` skip that one
            token); ``shift_labels`` keeps it either way.
        batch_rows: packs converted per Arrow record batch (bounds the Python-list overhead).

    Returns:
        ``datasets.Dataset`` with columns :data:`HF_COLUMNS` (module docstring for their meaning).

    Raises:
        ValueError: an unrepresentable final target with ``final_target="error"`` (names the sample and
            the fixes); a pack with media or M-RoPE tables; boundaries that do not cover the row;
            position ids that do not restart per physical segment.
    """
    import datasets
    import pyarrow as pa

    if final_target not in ("error", "drop"):
        raise ValueError(f"final_target must be 'error' or 'drop', got {final_target!r}")
    features = _features()
    schema = features.arrow_schema
    batches = []
    buf: dict[str, list] = {c: [] for c in HF_COLUMNS}

    def flush():
        if buf["input_ids"]:
            batches.append(pa.RecordBatch.from_pydict(buf, schema=schema))
            for c in HF_COLUMNS:
                buf[c] = []

    for i, pack in enumerate(packs):
        for c, v in _row(pack, i, final_target).items():
            buf[c].append(v)
        if len(buf["input_ids"]) >= batch_rows:
            flush()
    flush()
    table = pa.Table.from_batches(batches, schema=schema)
    info = datasets.DatasetInfo(
        description="seqpack packs: labels unshifted (HF), shift_labels per segment, seq_lengths physical (TRL)",
        features=features,
    )
    return datasets.Dataset(table, info=info)


def from_hf_dataset(dataset: Any) -> list:
    """Rebuild seqpack packs from a dataset made by :func:`to_hf_dataset` (or with the same columns).

    Labels come from ``shift_labels`` when the dataset has it, else from the unshifted ``labels`` (the HF
    convention; slots past a segment's real length are never labelled).

    Args:
        dataset: ``datasets.Dataset`` (or any sequence of dicts) with ``input_ids``, ``cu_seqlens``,
            ``cu_seqlens_padded``, ``labels`` and/or ``shift_labels``, optionally ``seq_lengths`` and
            ``sample_ids``.

    Returns:
        list of :class:`~seqpack.packed.PackedSequence` (every derived field rebuilt from the boundaries).

    Raises:
        KeyError: a missing column (a row without boundaries is never read as one sequence).
        ValueError: ``labels`` and ``shift_labels`` that disagree, or ``seq_lengths`` that are not
            ``diff(cu_seqlens_padded)`` (the row was edited after the export; naming the row).
    """
    cols = getattr(dataset, "column_names", None)
    rows = dataset.with_format("numpy") if cols is not None and hasattr(dataset, "with_format") else dataset
    out = []
    for i, r in enumerate(rows):
        have = list(r.keys())
        missing = [c for c in _BOUNDARY_COLUMNS if c not in have]
        if "labels" not in have and "shift_labels" not in have:
            missing.append("labels or shift_labels")
        if missing:
            raise KeyError(f"from_hf_dataset: row {i} lacks column(s) {missing}; it has {have}")
        cu = np.asarray(r["cu_seqlens"], dtype=np.int32)
        cup = np.asarray(r["cu_seqlens_padded"], dtype=np.int32)
        if "seq_lengths" in have and not np.array_equal(np.asarray(r["seq_lengths"]), np.diff(cup)):
            raise ValueError(f"from_hf_dataset: row {i}: seq_lengths {np.asarray(r['seq_lengths']).tolist()[:8]} "
                             f"are not the physical lengths diff(cu_seqlens_padded) {np.diff(cup).tolist()[:8]}")
        if "shift_labels" in have:
            lab = np.asarray(r["shift_labels"], dtype=np.int64)
            if "labels" in have and not np.array_equal(unshift_labels(lab, cup, final_target="drop"),
                                                       np.asarray(r["labels"], dtype=np.int64)):
                raise ValueError(f"from_hf_dataset: row {i}: labels is not shift_labels unshifted per segment; "
                                 "edit both columns together (or drop one)")
        else:
            lab = shift_unshifted_labels(np.asarray(r["labels"], dtype=np.int64), cup)
            lab[segment_fields(cup, np.diff(cu))[1]] = IGNORE_INDEX
        sids = r.get("sample_ids") if hasattr(r, "get") else None
        sids = [str(s) for s in sids] if sids is not None else [f"row{i}#seg{k}" for k in range(len(cup) - 1)]
        out.append(PackedSequence.from_boundaries(np.asarray(r["input_ids"], dtype=np.int64), lab, cu, cup,
                                                  sample_ids=sids))
    return out
