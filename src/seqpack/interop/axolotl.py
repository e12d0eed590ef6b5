"""Export seqpack's tokenized samples as an Axolotl pre-tokenized dataset (one row per sample).

Axolotl (0.19) uses a dataset as is, without a prompt strategy, when it has ``input_ids``,
``attention_mask`` and ``labels`` columns (``axolotl.utils.data.wrappers._is_dataset_already_tokenized``);
give such a dataset no ``type:``. The rows are seqpack's samples (chat template rendered, assistant-only
labels, over-length policy applied), in pack order:

* ``input_ids``: the sample's real tokens (no padding);
* ``attention_mask``: ones;
* ``labels``: unshifted (HF convention, the model shifts), from :func:`seqpack.sample.unshift_labels`.

Axolotl packs them itself (``sample_packing: true``: its multipack sampler, ``position_ids`` restarting per
sample, the attention mask dropped so transformers finds the boundaries from ``position_ids``). seqpack's
packs are not exported as rows because Axolotl rewrites every row's ``position_ids`` to ``0..len-1`` when
packing (``axolotl.utils.trainer.add_position_ids``), which would make a pre-packed row one sequence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from seqpack.interop._export import open_source, save_dataset
from seqpack.packed import real_boundaries
from seqpack.sample import unshift_labels

__all__ = ["AXOLOTL_COLUMNS", "axolotl_rows", "export_axolotl"]

AXOLOTL_COLUMNS = ("input_ids", "attention_mask", "labels")


def axolotl_rows(packs: Any, *, final_target: str = "error") -> Iterator[dict[str, Any]]:
    """One Axolotl row per segment of each pack (module docstring), in pack order.

    Args:
        packs: iterable of text :class:`~seqpack.packed.PackedSequence`.
        final_target: ``"error"`` or ``"drop"`` for a target on a sample's last token (a truncated
            sample), which unshifted labels cannot hold (:func:`seqpack.sample.unshift_labels`).

    Yields:
        ``{"input_ids", "attention_mask", "labels"}`` int64 lists of the sample's real length.

    Raises:
        ValueError: an image pack; an unrepresentable final target with ``final_target="error"``.
    """
    for pack in packs:
        if any(m for m in (getattr(pack, "media", None) or [])):
            raise ValueError("axolotl_rows: image packs are not exported (Axolotl re-processes images with its "
                             "processor); export text data")
        cu, cup, n = real_boundaries(pack)
        # unshift per segment over its real tokens: a target past the real end has no slot to live in
        real_cu = np.concatenate([[0], np.cumsum(np.diff(cu))])
        keep = np.concatenate([np.arange(int(cup[k]), int(cup[k]) + int(cu[k + 1] - cu[k])) for k in range(n)])
        ids = np.asarray(pack.input_ids, dtype=np.int64)[keep]
        lab = unshift_labels(np.asarray(pack.labels)[keep], real_cu, final_target=final_target,
                             sample_ids=getattr(pack, "sample_ids", None))
        for k in range(n):
            a, b = int(real_cu[k]), int(real_cu[k + 1])
            yield {"input_ids": ids[a:b].tolist(), "attention_mask": [1] * (b - a), "labels": lab[a:b].tolist()}


def export_axolotl(source: Any, output_dir: str | os.PathLike, *, final_target: str = "error") -> Path:
    """Write :func:`axolotl_rows` as a ``datasets`` ``save_to_disk`` folder (Axolotl: ``datasets: - path: DIR``).

    Args:
        source: a seqpack packed dataset directory, a :class:`~seqpack.io.PackedDataset`, or an iterable of
            text ``PackedSequence`` s.
        output_dir: the folder to write; must not exist.
            Written into a hidden temp sibling and renamed into place when complete
            (:func:`seqpack.interop._export.save_dataset`): a killed export leaves no partial folder.
        final_target: as :func:`axolotl_rows`.

    Memory: every row is built in memory before ``save_to_disk``: 189 bytes per token of Python objects
    (tracemalloc, 100 packs of 4000 tokens) plus the Arrow table; export a large dataset in parts.

    Returns:
        ``output_dir`` as a ``Path``.

    Raises:
        FileExistsError: ``output_dir`` exists. NotADirectoryError, PermissionError: its parent is a file / not
            writable (checked before any row is built). ValueError: as :func:`axolotl_rows`.
    """
    import datasets

    def build() -> Any:
        i64 = datasets.Sequence(datasets.Value("int64"))
        features = datasets.Features({c: i64 for c in AXOLOTL_COLUMNS})
        rows = list(axolotl_rows(open_source(source), final_target=final_target))
        return datasets.Dataset.from_list(rows, features=features)

    return save_dataset(build, output_dir)
