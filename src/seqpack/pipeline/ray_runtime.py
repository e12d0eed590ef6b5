"""Ray for the Ray engine: import it with an install hint, start or join a runtime, and carry worker
errors back to the driver unchanged. Ray is an optional dependency: ``pip install "seqpack[ray]"``."""

from __future__ import annotations

import logging
import os
import pickle
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from seqpack.data.records import DataFormatError

__all__ = ["RAY_INSTALL_HINT", "num_workers", "pack_exc", "ray_runtime", "require_ray", "start_ray", "unpack_exc",
           "unwrap"]

RAY_INSTALL_HINT = 'the Ray engine needs Ray Data: pip install "seqpack[ray]"  (or: pip install "ray[data]")'


def require_ray():
    """Import and return ``ray`` (with ``ray.data``).

    Raises:
        ImportError: Ray Data is not installed; the message says ``pip install "seqpack[ray]"``.
    """
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise ImportError(RAY_INSTALL_HINT) from e
    return ray


def start_ray(
    num_cpus: int | None = None,
    *,
    object_store_memory: int | None = None,
    address: str | None = None,
    **init_kwargs: Any,
):
    """Start (or connect to) Ray the way the engine does: small object store, no dashboard, quiet.

    This seqpack's source directory is put on the workers' ``PYTHONPATH``, so a source checkout (or
    ``pytest`` with ``pythonpath = src``) works on a local runtime without installing seqpack. Use it in
    tests or notebooks to start Ray once and run several packing jobs on it.

    Args:
        num_cpus: CPUs of a local runtime (``None``: all).
        object_store_memory: bytes (default 256 MiB; Ray spills to disk beyond it).
        address: an existing cluster to connect to (``None``: start a local runtime).
        **init_kwargs: passed on to ``ray.init``.

    Returns:
        what ``ray.init`` returns.

    Raises:
        ImportError: Ray is not installed (says ``pip install "seqpack[ray]"``).
    """
    ray = require_ray()
    pkg_parent = str(Path(__file__).resolve().parents[2])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pkg_parent + (os.pathsep + old if old else "")
    kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    kw.update(init_kwargs)
    if address is None:
        kw["object_store_memory"] = object_store_memory if object_store_memory is not None else 256 * 1024**2
        kw["num_cpus"] = num_cpus
    try:
        return ray.init(address=address, **kw)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@contextmanager
def ray_runtime(num_cpus: int | None, object_store_memory: int | None, address: str | None) -> Iterator[Any]:
    """Use the running Ray runtime, or start a local one (and stop it afterwards).

    A runtime started here gets ``num_cpus`` CPUs, a small object store (``object_store_memory``,
    default 256 MiB, spilled to disk beyond that), no dashboard, and this seqpack on the workers'
    ``PYTHONPATH`` (so a source checkout works without installing it).
    """
    ray = require_ray()
    owned = False
    if not ray.is_initialized():
        start_ray(num_cpus=num_cpus, object_store_memory=object_store_memory, address=address)
        owned = True
    ctx = ray.data.DataContext.get_current()
    old_bars, old_level = ctx.enable_progress_bars, logging.getLogger("ray.data").level
    old_order = ctx.execution_options.preserve_order
    ctx.enable_progress_bars = False
    # blocks reach the driver in pack order, so its reorder buffer stays empty (bounded memory)
    ctx.execution_options.preserve_order = True
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        yield ray
    finally:
        ctx.enable_progress_bars = old_bars
        ctx.execution_options.preserve_order = old_order
        logging.getLogger("ray.data").setLevel(old_level)
        if owned:
            ray.shutdown()


def num_workers(ray: Any, num_cpus: int | None, num_shards: int) -> int:
    """Tokenizer actors to use: ``num_cpus`` (else the cluster's CPUs), at most one per shard."""
    avail = int(ray.cluster_resources().get("CPU", 1)) if num_cpus is None else int(num_cpus)
    return max(1, min(avail, num_shards))


def unwrap(exc: BaseException) -> BaseException:
    """Find the seqpack/user error inside Ray's wrappers (``RayTaskError``, ``UserCodeException``)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (DataFormatError, FileNotFoundError)) or type(e).__name__ in (
            "OverlengthError", "PackedSequenceError", "TokenizerError"
        ):
            return e
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            e = cause
            continue
        e = e.__cause__ or e.__context__
    return exc


def pack_exc(e: BaseException) -> bytes:
    """Serialise an exception so the driver can re-raise it with the same type, message and attributes
    (plain pickling re-runs ``__init__`` with the formatted message and can change it)."""
    try:
        return pickle.dumps((type(e), e.args, dict(e.__dict__)), protocol=5)
    except Exception:  # unpicklable attribute: keep type name and message
        return pickle.dumps((RuntimeError, (f"{type(e).__name__}: {e}",), {}), protocol=5)


def unpack_exc(blob: bytes) -> BaseException:
    """The exception serialised by :func:`pack_exc`, rebuilt without re-running ``__init__``."""
    cls, args, state = pickle.loads(blob)
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc
