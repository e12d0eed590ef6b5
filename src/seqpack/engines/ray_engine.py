"""The offline packing job on Ray Data: tokenize input shards in parallel, plan, build, write.

Same job, arguments, output and :class:`~seqpack.pipeline.PackResult` as the local engine
(:func:`seqpack.pipeline.pack_dataset`), plus ``num_cpus`` and ``planning``:

1. **read + tokenize** (parallel): ``ray.data.from_items(<one item per input file>)`` ->
   ``map_batches(<tokenize one shard>)`` on an actor pool (the tokenizer is loaded once per actor).
   Each input file (or ``datasets.Dataset``) is one shard and goes through the same
   :func:`seqpack.data.prepare` as the local engine, so sample ids (``"<file name>:<index>"``),
   over-length handling and the per-record report are identical. Shard your corpus into several files
   to use several workers (one file is one task).
2. **plan**:
   * ``planning="global"`` (default): the driver collects only the lengths (8 bytes per sample, in
     input order) and calls :func:`seqpack.algorithms.pack_lengths` once, exactly as the local engine
     does: for the same inputs, settings and seed the packs are **identical** to the local engine's.
   * ``planning="per_shard"``: every shard is planned and built inside its own task (no shuffle of
     token data). Packs never mix shards, so some efficiency is lost; the driver also plans the
     collected lengths globally and records the loss in ``metadata.extra["ray"]``
     (``efficiency_loss`` = global - per-shard packing efficiency, and the pack counts).
3. **build** (parallel): for global planning every sample row gets its pack id, rows are grouped by
   pack chunk (``groupby(...).map_groups``) and each group builds its rows with
   :func:`seqpack.packed.build_packed_sequence` (validated like the local engine).
4. **write**: the driver streams the built rows in pack order into the same
   :class:`seqpack.io.PackedWriter` (atomic, fingerprinted ``metadata.json``, ``report.jsonl``).

Memory: token arrays live in Ray's object store (spilled to disk beyond ``object_store_memory``); the
driver holds the length array, the pack assignment (~20 bytes per sample) and one Parquet shard of rows.

Ray is an optional dependency: ``pip install "seqpack[ray]"``.
"""

from __future__ import annotations

import os
import pickle
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from seqpack.algorithms import resolve_algorithm
from seqpack.io.fingerprint import describe_input
from seqpack.io.writer import PackedWriter, check_output_dir

__all__ = ["PLANNING_MODES", "RAY_INSTALL_HINT", "pack_dataset_ray", "require_ray", "start_ray"]

PLANNING_MODES = ("global", "per_shard")
RAY_INSTALL_HINT = 'the Ray engine needs Ray Data: pip install "seqpack[ray]"  (or: pip install "ray[data]")'

_KIND_ROW = 0  # a sample row (global planning) or a built pack row (per-shard planning)
_KIND_SHARD = 1  # one summary row per shard: report, lengths, trainable count, per-shard plan


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
def _ray_runtime(num_cpus: int | None, object_store_memory: int | None, address: str | None) -> Iterator[Any]:
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
    import logging

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


def _num_workers(ray: Any, num_cpus: int | None, num_shards: int) -> int:
    avail = int(ray.cluster_resources().get("CPU", 1)) if num_cpus is None else int(num_cpus)
    return max(1, min(avail, num_shards))


def _unwrap(exc: BaseException) -> BaseException:
    """Find the seqpack/user error inside Ray's wrappers (``RayTaskError``, ``UserCodeException``)."""
    from seqpack.data.formats import DataFormatError

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


def _pack_exc(e: BaseException) -> bytes:
    """Serialise an exception so the driver can re-raise it with the same type, message and attributes
    (plain pickling re-runs ``__init__`` with the formatted message and can change it)."""
    try:
        return pickle.dumps((type(e), e.args, dict(e.__dict__)), protocol=5)
    except Exception:  # unpicklable attribute: keep type name and message
        return pickle.dumps((RuntimeError, (f"{type(e).__name__}: {e}",), {}), protocol=5)


def _unpack_exc(blob: bytes) -> BaseException:
    cls, args, state = pickle.loads(blob)
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


# ----------------------------------------------------------------------------------- ray UDFs


def _list_col(arrs: list[np.ndarray], pa: Any, value_type: Any) -> Any:
    lengths = np.fromiter((len(a) for a in arrs), dtype=np.int64, count=len(arrs))
    offsets = np.zeros(len(arrs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    dt = np.dtype(value_type.to_pandas_dtype())
    values = np.concatenate(arrs).astype(dt, copy=False) if arrs else np.zeros(0, dt)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, value_type))


def _rows_table(pa: Any, kind: int, shard: int, local: np.ndarray, cols: dict[str, Any], summary: bytes | None = None):
    """One Arrow table with a fixed schema (sample rows, pack rows and shard rows share it)."""
    n = len(local)
    return pa.table(
        {
            "kind": pa.array(np.full(n, kind, np.int8)),
            "shard": pa.array(np.full(n, shard, np.int32)),
            "local": pa.array(np.asarray(local, np.int64)),
            "input_ids": cols.get("input_ids", pa.nulls(n, pa.large_list(pa.int32()))),
            "labels": cols.get("labels", pa.nulls(n, pa.large_list(pa.int32()))),
            "cu_seqlens": cols.get("cu_seqlens", pa.nulls(n, pa.large_list(pa.int32()))),
            "cu_seqlens_padded": cols.get("cu_seqlens_padded", pa.nulls(n, pa.large_list(pa.int32()))),
            "sample_ids": cols.get("sample_ids", pa.nulls(n, pa.large_list(pa.string()))),
            "summary": pa.array([summary] * n, pa.large_binary()),
        }
    )


class _ShardWorker:
    """Ray Data UDF (actor): read + tokenize whole input shards with :func:`seqpack.data.prepare`;
    with per-shard planning also plan and build the shard's packs."""

    def __init__(self, items: list, names: list[str], tokenizer: Any, settings: dict[str, Any]) -> None:
        from seqpack.data.tokenizer import load_tokenizer

        self.items = items
        self.names = names
        self.tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        self.s = settings

    def __call__(self, batch: dict[str, np.ndarray]):
        import pyarrow as pa

        for k in np.asarray(batch["shard"]).tolist():
            table = self._one(int(k), pa)
            # emit bounded blocks, so no single object-store block holds a whole shard
            rows = self.s.get("block_rows", 4096)
            for start in range(0, max(table.num_rows, 1), rows):
                yield table.slice(start, rows)

    def _one(self, k: int, pa: Any):
        from seqpack.data import prepare
        from seqpack.data.prepare import _display_names, _rename_source

        s = self.s
        item = self.items[k]
        try:
            samples, report = prepare(
                [item], self.tok, seq_length=s["seq_length"], overlength=s["overlength"], on_error=s["on_error"],
                train_on=s["train_on"], format=s["format"],
            )
        except Exception as e:  # bad input: hand the error itself to the driver (Ray keeps only its text)
            summary = pickle.dumps({"error": _pack_exc(e)}, protocol=5)
            return _rows_table(pa, _KIND_SHARD, k, np.array([-1]), {}, summary)
        with_images = next((x for x in samples if x.media and x.media.get("images")), None)
        if with_images is not None:  # found at tokenize time, before any planning or writing
            e = ValueError(
                f"sample {with_images.sample_id} has images: image-text records are packed by the local engine only "
                "(it expands each <image> to its image tokens). Fix: run `seqpack pack` without --engine ray, or "
                "split the image records into their own job."
            )
            return _rows_table(pa, _KIND_SHARD, k, np.array([-1]), {}, pickle.dumps({"error": _pack_exc(e)}, protocol=5))
        # prepare() names a lone input by its file name; the driver's name may be the full path
        # (when two inputs share a file name): rewrite the prefix so ids equal the local engine's.
        _rename_source((*samples, *report.entries), _display_names([item])[0], self.names[k])
        lengths = np.fromiter((x.length for x in samples), dtype=np.int64, count=len(samples))
        summary: dict[str, Any] = {"report": report, "lengths": lengths}
        if s["planning"] == "global":
            cols = {
                "input_ids": _list_col([x.input_ids for x in samples], pa, pa.int32()),
                "labels": _list_col([x.labels for x in samples], pa, pa.int32()),
                "sample_ids": pa.array([[str(x.sample_id)] for x in samples], pa.large_list(pa.string())),
            }
            rows = _rows_table(pa, _KIND_ROW, k, np.arange(len(samples)), cols)
        else:
            rows, summary["plan"] = self._plan_and_build(samples, lengths, k, pa)
        head = _rows_table(pa, _KIND_SHARD, k, np.array([-1]), {}, pickle.dumps(summary, protocol=5))
        return pa.concat_tables([head, rows])

    def _plan_and_build(self, samples: list, lengths: np.ndarray, k: int, pa: Any):
        from seqpack.algorithms import pack_lengths

        s = self.s
        if not samples:
            return _rows_table(pa, _KIND_ROW, k, np.zeros(0, np.int64), {}), None
        plan = pack_lengths(lengths, s["seq_length"], s["algorithm"], seed=s["seed"], pad_to_multiple_of=s["m"])
        packs = [_build(samples, b, s) for b in plan.bins]
        return _pack_rows(pa, k, np.arange(len(packs)), packs), {
            "bins": [np.asarray(b, np.int64) for b in plan.bins],
            "lower_bound": int(plan.lower_bound),
        }


def _build(samples: list, idx: np.ndarray, s: dict[str, Any]):
    """The local engine's row builder (``seqpack.pipeline._build_row``) on ``samples[idx]``."""
    from seqpack.pipeline import _build_row

    return _build_row(
        [samples[int(i)] for i in idx], m=s["m"], pad_token_id=s["pad_id"], seq_length=s["seq_length"],
        validate=s["validate"], context_parallel_size=s["cp"],
    )


def _pack_rows(pa: Any, shard: int, local: np.ndarray, packs: list):
    cols = {
        "input_ids": _list_col([p.input_ids for p in packs], pa, pa.int32()),
        "labels": _list_col([p.labels for p in packs], pa, pa.int32()),
        "cu_seqlens": _list_col([p.cu_seqlens for p in packs], pa, pa.int32()),
        "cu_seqlens_padded": _list_col([p.cu_seqlens_padded for p in packs], pa, pa.int32()),
        "sample_ids": pa.array([list(p.sample_ids) for p in packs], pa.large_list(pa.string())),
    }
    return _rows_table(pa, _KIND_ROW, shard, local, cols)


def _assign_packs(t, assignment: Any):
    """Ray Data UDF (task): add ``pack`` (global pack id), ``slot`` (position in the pack) and ``group``
    (pack chunk) to sample rows, from the driver's plan (broadcast once through the object store)."""
    import pyarrow as pa
    import ray

    a = ray.get(assignment) if isinstance(assignment, ray.ObjectRef) else assignment
    offsets, pack_of, slot_of, per_group = a
    g = offsets[t.column("shard").to_numpy()] + t.column("local").to_numpy()
    pack = pack_of[g]
    return (
        t.append_column("pack", pa.array(pack))
        .append_column("slot", pa.array(slot_of[g]))
        .append_column("group", pa.array(pack // per_group))
    )


def _build_group(t, settings: dict[str, Any]):
    """Ray Data UDF (task) for ``map_groups``: build (and validate) every pack of one pack chunk."""
    import pyarrow as pa

    from seqpack.data.sample import Sample

    pack = t.column("pack").to_numpy()
    slot = t.column("slot").to_numpy()
    order = np.lexsort((slot, pack))
    ids = t.column("input_ids")
    labs = t.column("labels")
    sids = t.column("sample_ids")
    samples = [
        Sample(
            ids[i].values.to_numpy(zero_copy_only=False),
            labs[i].values.to_numpy(zero_copy_only=False),
            sids[i].as_py()[0],
        )
        for i in order.tolist()
    ]
    p_sorted = pack[order]
    starts = np.flatnonzero(np.r_[True, p_sorted[1:] != p_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)]
    packs = [_build(samples, np.arange(a, b), settings) for a, b in zip(starts, ends)]
    return _pack_rows(pa, 0, p_sorted[starts], packs).drop_columns(["summary"])


# ----------------------------------------------------------------------------------- driver


def _iter_pack_rows(ds: Any, first_pack: np.ndarray, num_packs: int) -> Iterator[Any]:
    """Yield the built packs of ``ds`` as ``PackedSequence`` rows in global pack order.

    A row's global pack id is ``first_pack[shard] + local``. Ray Data may deliver blocks out of order;
    rows that arrive early wait in a small reorder buffer (blocks are produced in nearly sorted order,
    so the buffer stays small), and no distributed sort is needed.

    Raises:
        RuntimeError: a pack is missing or duplicated (never silently dropped).
    """
    from seqpack.packed import PackedSequence

    pending: dict[int, Any] = {}
    nxt = 0
    for b in ds.iter_batches(batch_format="pyarrow", batch_size=64):
        gid = first_pack[b.column("shard").to_numpy()] + b.column("local").to_numpy()
        cols = {c: b.column(c) for c in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded", "sample_ids")}
        for i in range(b.num_rows):
            g = int(gid[i])
            if g in pending or g < nxt:
                raise RuntimeError(f"ray engine: pack {g} was built twice")
            pending[g] = PackedSequence.from_boundaries(
                cols["input_ids"][i].values.to_numpy(zero_copy_only=False),
                cols["labels"][i].values.to_numpy(zero_copy_only=False),
                cols["cu_seqlens"][i].values.to_numpy(zero_copy_only=False),
                cols["cu_seqlens_padded"][i].values.to_numpy(zero_copy_only=False),
                sample_ids=cols["sample_ids"][i].as_py(),
            )
            while nxt in pending:
                yield pending.pop(nxt)
                nxt += 1
    if nxt != num_packs or pending:
        raise RuntimeError(f"ray engine: {nxt} of {num_packs} packs arrived in order; missing pack {nxt}")


def pack_dataset_ray(
    inputs: Any = None,
    output: str | os.PathLike = "packed",
    *,
    tokenizer: Any = "qwen3",
    seq_length: int = 4096,
    algorithm: Any = None,
    pad_to_multiple_of: int = 1,
    context_parallel_size: int = 1,
    overlength: str = "truncate",
    on_error: str = "raise",
    train_on: str = "assistant",
    seed: int = 0,
    format: str | None = "auto",
    overwrite: bool = False,
    rows_per_shard: int = 2048,
    validate: bool = True,
    progress: Any = None,
    log: Callable[[str], None] | None = None,
    num_cpus: int | None = None,
    planning: str = "global",
    packs_per_task: int = 512,
    ray_address: str | None = None,
    object_store_memory: int | None = None,
):
    """Pack chat/instruction data on Ray Data (module docstring); drop-in for ``pack_dataset``.

    Args:
        inputs ... log: exactly as :func:`seqpack.pipeline.pack_dataset` (same defaults, same meaning).
        num_cpus: CPUs for a local Ray runtime started here, and the most tokenizer actors used
            (default: every CPU of the cluster). Ignored for the size of an already running runtime.
        planning: ``"global"`` (packs identical to the local engine's) or ``"per_shard"`` (plan inside
            each input shard; the efficiency loss is recorded in ``metadata.extra["ray"]``).
        packs_per_task: packs built per Ray task in the global build stage.
        ray_address: connect to this cluster when Ray is not initialised yet (``None``: start a local
            runtime, or use the one already running).
        object_store_memory: object store size in bytes for a runtime started here (default 256 MiB;
            Ray spills to disk beyond it).

    Returns:
        :class:`seqpack.pipeline.PackResult`; ``timings_s`` has ``prepare`` (tokenize, parallel),
        ``plan``, ``write`` (build + write) and ``total``; ``metadata.extra["ray"]`` records the planning
        mode, worker count and (per-shard) the efficiency loss.

    Raises:
        ImportError: Ray is not installed (says ``pip install "seqpack[ray]"``).
        PackConfigError: invalid settings or policies (as the local engine), or an unknown ``planning``.
        NothingToPackError: every record was dropped or skipped (nothing is written).
        FileExistsError: ``output`` exists and ``overwrite`` is False (checked before starting Ray).
        DataFormatError / OverlengthError / FileNotFoundError: bad inputs, re-raised from the worker with
            the local engine's message (file, record, fix).
    """
    from seqpack.pipeline import (
        PackConfigError,
        PackResult,
        _check_plan_places_all,
        _input_list,
        _load_tokenizer,
        _metadata_settings,
        _nothing_to_pack,
        _pad_token_id,
        _Stages,
        _tokenizer_hashes,
        _validate_policies,
        _validate_settings,
        build_metadata,
    )

    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    stages = _Stages(progress)
    if planning not in PLANNING_MODES:
        raise PackConfigError(f"planning={planning!r} (key: planning) must be one of {PLANNING_MODES}")
    if int(packs_per_task) < 1:
        raise PackConfigError(f"packs_per_task must be >= 1, got {packs_per_task}")
    m = _validate_settings(seq_length, pad_to_multiple_of, context_parallel_size)
    algo = resolve_algorithm(algorithm, error=PackConfigError)
    _validate_policies(overlength=overlength, on_error=on_error, train_on=train_on, format=format)
    output = Path(output)
    check_output_dir(output, overwrite)
    require_ray()
    from ray.data.expressions import col

    from seqpack.data.formats import expand_inputs
    from seqpack.data.prepare import _display_names

    inputs = _input_list(inputs)
    fmt = None if format in (None, "auto") else format
    items = expand_inputs(inputs)
    names = _display_names(items)
    tok, tok_name = _load_tokenizer(tokenizer)
    tok_hash, chat_hash = _tokenizer_hashes(tok)
    pad_id = _pad_token_id(tok)
    settings = {
        "seq_length": int(seq_length), "overlength": overlength, "on_error": on_error, "train_on": train_on,
        "format": fmt, "planning": planning, "algorithm": algo, "seed": int(seed), "m": int(m),
        "pad_id": int(pad_id), "validate": bool(validate), "cp": int(context_parallel_size),
    }

    with _ray_runtime(num_cpus, object_store_memory, ray_address) as ray:
        workers = _num_workers(ray, num_cpus, len(items))
        say(f"ray: {len(items)} input shard(s) on {workers} tokenizer worker(s), planning={planning}")
        cpus = int(ray.cluster_resources().get("CPU", 1))
        if len(items) < cpus:
            say(f"ray: only {len(items)} input file(s) for {cpus} CPUs; one file is one tokenize task, so split "
                "the corpus into more files (e.g. `split -l 10000 big.jsonl part-` and rename to .jsonl) to use them all")
        stages("prepare", 0, len(items))
        # ---- 1. read + tokenize in parallel (one task per input shard)
        try:
            tokenized = (
                ray.data.from_items([{"shard": k} for k in range(len(items))], override_num_blocks=len(items))
                .map_batches(
                    _ShardWorker,
                    batch_size=1,
                    fn_constructor_kwargs={
                        "items": items, "names": names,
                        "tokenizer": tokenizer if isinstance(tokenizer, (str, os.PathLike)) else tok,
                        "settings": settings,
                    },
                    compute=ray.data.ActorPoolStrategy(size=workers),
                    num_cpus=1,
                )
                .materialize()
            )
            summaries: dict[int, dict[str, Any]] = {}
            heads = tokenized.filter(expr=col("kind") == _KIND_SHARD).select_columns(["shard", "summary"])
            for b in heads.iter_batches(batch_format="pyarrow", batch_size=None):
                for k, blob in zip(b.column("shard").to_pylist(), b.column("summary").to_pylist()):
                    summaries[int(k)] = pickle.loads(blob)
        except Exception as e:  # surface the worker's own error (file, record, fix)
            inner = _unwrap(e)
            if inner is e:
                raise
            raise inner from None
        stages("prepare", len(items), len(items))
        from seqpack.data.sample import PrepareReport

        for k in range(len(items)):  # the first bad shard in input order, as the local engine would
            if "error" in summaries[k]:
                raise _unpack_exc(summaries[k]["error"])
        report = PrepareReport()
        shard_lengths = []
        for k in range(len(items)):
            report.merge(summaries[k]["report"])
            shard_lengths.append(summaries[k]["lengths"])
        lengths = np.concatenate(shard_lengths) if shard_lengths else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in shard_lengths])]).astype(np.int64)
        t_prep = time.perf_counter()
        say(f"prepared {len(lengths)} samples from {report.records_read} records")
        if len(lengths) == 0:
            raise _nothing_to_pack(items, report)

        # ---- 2. plan
        from seqpack.algorithms import PackingPlan, pack_lengths

        stages("plan", 0, 1)
        global_plan = pack_lengths(lengths, seq_length, algo, seed=seed, pad_to_multiple_of=m)
        ray_info: dict[str, Any] = {"engine": "ray", "planning": planning, "workers": workers, "input_shards": len(items)}
        if planning == "global":
            plan = global_plan
        else:
            bins, lb = [], 0
            for k in range(len(items)):
                p = summaries[k].get("plan")
                if p is None:
                    continue
                bins.extend(offsets[k] + b for b in p["bins"])
                lb += p["lower_bound"]
            loads = np.array([int((-(-lengths[b] // m) * m).sum()) for b in bins], dtype=np.int64)
            plan = PackingPlan(
                bins=bins, num_bins=len(bins), lower_bound=int(global_plan.lower_bound),
                utilization=float(lengths.sum() / (len(bins) * seq_length)), bin_loads=loads, algorithm=algo,
                capacity=int(seq_length), pad_to_multiple_of=int(m), detail={"per_shard_lower_bound_sum": lb},
            )
            eff_g = float(lengths.sum() / (global_plan.num_bins * seq_length))
            eff_s = float(lengths.sum() / (plan.num_bins * seq_length))
            ray_info.update(
                global_num_packs=int(global_plan.num_bins), per_shard_num_packs=int(plan.num_bins),
                global_packing_efficiency=round(eff_g, 6), per_shard_packing_efficiency=round(eff_s, 6),
                efficiency_loss=round(eff_g - eff_s, 6),
            )
            say(f"per-shard planning: {plan.num_bins} packs vs {global_plan.num_bins} with global planning "
                f"(efficiency {eff_s:.4f} vs {eff_g:.4f}, loss {eff_g - eff_s:.4f})")
        stages("plan", 1, 1)
        _check_plan_places_all(plan, len(lengths), f"{algo.value}, planning={planning}")
        t_plan = time.perf_counter()

        # ---- 3. build rows (parallel) and 4. write in pack order
        rows_ds = tokenized.filter(expr=col("kind") == _KIND_ROW)
        if planning == "global":
            pack_of = plan.bin_ids(len(lengths))
            slot_of = np.empty(len(lengths), np.int32)
            for b in plan.bins:
                slot_of[b] = np.arange(len(b), dtype=np.int32)
            ref = ray.put((offsets, pack_of, slot_of, int(packs_per_task)))
            n_groups = -(-int(plan.num_bins) // int(packs_per_task))
            # plain tasks (not actor pools) so the stages never wait on each other's reserved CPUs
            built = (
                rows_ds.drop_columns(["cu_seqlens", "cu_seqlens_padded", "summary", "kind"])
                .map_batches(_assign_packs, fn_kwargs={"assignment": ref}, batch_format="pyarrow")
                .groupby("group", num_partitions=max(1, min(n_groups, 1024)))
                .map_groups(_build_group, fn_kwargs={"settings": settings}, batch_format="pyarrow")
            )
            first_pack = np.zeros(1, np.int64)  # built rows carry shard 0 and local = global pack id
        else:
            built = rows_ds
            per = [len(summaries[k]["plan"]["bins"]) if summaries[k].get("plan") else 0 for k in range(len(items))]
            first_pack = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)

        num_packs = int(plan.num_bins)
        meta_settings = _metadata_settings(
            seq_length=seq_length, pad_to_multiple_of=pad_to_multiple_of,
            context_parallel_size=context_parallel_size, effective_pad_multiple=m, algorithm=algo.value,
            seed=seed, overlength=overlength, train_on=train_on, on_error=on_error, format=fmt,
            tokenizer_hash=tok_hash, chat_template_hash=chat_hash, pad_token_id=pad_id,
        )
        meta = build_metadata(
            lengths=lengths, trainable_tokens=int(report.trainable_tokens), bins=plan.bins,
            lower_bound=int(global_plan.lower_bound), report=report, settings=meta_settings,
            described_inputs=[describe_input(i) for i in items], tokenizer_name=tok_name,
            # per-shard planning gives different packs from the same inputs: a different fingerprint
            fingerprint_extra={"planning": "per_shard"} if planning == "per_shard" else None,
        )
        meta.extra["ray"] = ray_info
        stages("write", 0, num_packs)
        written = 0
        try:
            with PackedWriter(output, overwrite=overwrite, rows_per_shard=rows_per_shard) as w:
                for row in _iter_pack_rows(built, first_pack, num_packs):
                    w.write(row)
                    written += 1
                    if written % 64 == 0:
                        stages("write", written, num_packs)
                meta = w.finalize(meta, report.entries)
        except Exception as e:
            inner = _unwrap(e)
            if inner is e:
                raise
            raise inner from None
        stages("write", num_packs, num_packs)
    t_end = time.perf_counter()
    say(f"wrote {num_packs} packs to {output}")
    return PackResult(
        output=output, metadata=meta, report=report, plan=plan,
        timings_s={
            "prepare": round(t_prep - t0, 3), "plan": round(t_plan - t_prep, 3),
            "write": round(t_end - t_plan, 3), "total": round(t_end - t0, 3),
        },
    )
