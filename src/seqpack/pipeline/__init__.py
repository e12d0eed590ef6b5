"""The offline packing job (``seqpack pack`` and :func:`pack_dataset`), read top to bottom:

* :mod:`~seqpack.pipeline.job`: :class:`PackJob`, every setting of a job, validated before data is read;
* :mod:`~seqpack.pipeline.stages`: prepare (per input file) -> plan (``pack_lengths``) -> build rows -> write;
* :mod:`~seqpack.pipeline.local`: :func:`pack_dataset`, the stages in one process;
* :mod:`~seqpack.pipeline.ray`: :func:`pack_dataset_ray`, the same stages on Ray Data (``seqpack[ray]``).

Image-text records are packed at their expanded length (every ``<image>`` becomes the model's image-token
run, ``seqpack.data.media``), and each pack stores its segments' image paths and ``image_grid_thw`` (no
pixels; ``load_packed(..., load_media=True)`` recomputes them with the settings in ``metadata.json``).
"""

from seqpack.data.media.expand import apply_length_policy
from seqpack.pipeline.cli_text import PACK_FLAGS, cli_error_text, cli_message
from seqpack.pipeline.job import (
    NothingToPackError,
    PackConfigError,
    PackJob,
    dedupe_inputs,
    processor_settings,
    resolve_image_processor,
    sample_data_path,
)
from seqpack.pipeline.local import PackResult, pack_dataset
from seqpack.pipeline.metadata import build_metadata, media_metadata
from seqpack.pipeline.ray import pack_dataset_ray

__all__ = [
    "NothingToPackError",
    "PACK_FLAGS",
    "PackConfigError",
    "PackJob",
    "PackResult",
    "apply_length_policy",
    "build_metadata",
    "cli_error_text",
    "cli_message",
    "ENGINES",
    "dedupe_inputs",
    "get_engine",
    "media_metadata",
    "pack_dataset",
    "pack_dataset_ray",
    "processor_settings",
    "resolve_image_processor",
    "sample_data_path",
]

#: Engine names accepted by ``seqpack pack --engine`` and :func:`get_engine`.
ENGINES = ("local", "ray")


def get_engine(name: str):
    """Return the ``pack_dataset``-compatible callable of an engine: ``"local"`` (:func:`pack_dataset`)
    or ``"ray"`` (:func:`pack_dataset_ray`; same arguments plus the Ray ones, Ray imported on use).

    Raises:
        ValueError: unknown engine name (lists the valid ones).
    """
    engines = {"local": pack_dataset, "ray": pack_dataset_ray}
    if name not in engines:
        raise ValueError(f"engine={name!r} is not an engine; choose one of: {', '.join(ENGINES)}")
    return engines[name]
