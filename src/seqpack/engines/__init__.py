"""Execution engines of the offline packing job, re-exported from :mod:`seqpack.pipeline`: the local
engine :func:`~seqpack.pipeline.pack_dataset` and the Ray engine :func:`~seqpack.pipeline.pack_dataset_ray`
(``pip install "seqpack[ray]"``; same arguments, result type and on-disk output)."""

from seqpack.pipeline import ENGINES, get_engine, pack_dataset, pack_dataset_ray
from seqpack.pipeline.ray import start_ray

__all__ = ["ENGINES", "get_engine", "pack_dataset", "pack_dataset_ray", "start_ray"]
