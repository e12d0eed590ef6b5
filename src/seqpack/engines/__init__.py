"""Execution engines for the offline packing job.

The local engine is :func:`seqpack.pipeline.pack_dataset` (one process). :mod:`seqpack.engines.ray_engine`
runs the same job on a Ray cluster (``pip install "seqpack[ray]"``): same signature, same result type,
same on-disk output; Ray is imported only when that engine is used.
"""

ENGINES = ("local", "ray")

__all__ = ["ENGINES", "get_engine"]


def get_engine(name: str):
    """Return the ``pack_dataset``-compatible callable of an engine (``"local"`` or ``"ray"``).

    Raises:
        ValueError: unknown engine name (lists the valid ones).
    """
    if name == "local":
        from seqpack.pipeline import pack_dataset

        return pack_dataset
    if name == "ray":
        from seqpack.engines.ray_engine import pack_dataset_ray

        return pack_dataset_ray
    raise ValueError(f"unknown engine {name!r} (key: engine); choose one of: {', '.join(ENGINES)}")
