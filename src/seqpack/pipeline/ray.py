"""The offline packing job on Ray Data: the stages of :mod:`seqpack.pipeline.stages` mapped over input
files (one Ray task per file), one global plan on the driver (or one per shard), rows built in
parallel and streamed in pack order into the same writer. Same job (:class:`PackJob`), output and
:class:`~seqpack.pipeline.local.PackResult` as the local engine. How it runs, planning modes and memory:
``docs/notes/ray_engine.md``. Ray is an optional dependency: ``pip install "seqpack[ray]"``.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Callable, Iterator

import numpy as np

from seqpack.algorithms import PackingPlan
from seqpack.sample import Sample
from seqpack.io.fingerprint import describe_input
from seqpack.io.output_lock import lock_output
from seqpack.pipeline import stages
from seqpack.pipeline.job import PackConfigError, PackJob
from seqpack.pipeline.local import PackResult
from seqpack.pipeline.metadata import build_metadata
from seqpack.pipeline.ray_rows import KIND_ROW, KIND_SHARD, iter_pack_rows, list_column, pack_rows, rows_table
from seqpack.pipeline.ray_runtime import (
    RAY_INSTALL_HINT,
    num_workers,
    pack_exc,
    ray_runtime,
    require_ray,
    start_ray,
    unpack_exc,
    unwrap,
)

__all__ = ["PLANNING_MODES", "RAY_INSTALL_HINT", "pack_dataset_ray", "require_ray", "start_ray"]

PLANNING_MODES = ("global", "per_shard")

_BLOCK_ROWS = 4096  # rows per emitted block, so no single object-store block holds a whole shard


def _refuse_images(samples: list) -> None:
    """The Ray engine packs text only (image expansion runs in the local engine); found at tokenize time."""
    with_images = next((x for x in samples if x.media and x.media.get("images")), None)
    if with_images is not None:
        raise ValueError(
            f"sample {with_images.sample_id} has images: image-text records are packed by the local engine only "
            "(it expands each <image> to its image tokens). Fix: run `seqpack pack` without --engine ray, or "
            "split the image records into their own job."
        )


class _ShardWorker:
    """Ray Data UDF (actor): the prepare stage on whole input shards; with per-shard planning also
    plan and build the shard's packs. The tokenizer is loaded once per actor."""

    def __init__(self, job: PackJob, names: list[str], planning: str) -> None:
        self.job, self.names, self.planning = job, names, planning
        self.tok = stages.open_tokenizer(job)

    def __call__(self, batch: dict[str, np.ndarray]):
        import pyarrow as pa

        for k in np.asarray(batch["shard"]).tolist():
            table = self._one(int(k), pa)
            for start in range(0, max(table.num_rows, 1), _BLOCK_ROWS):
                yield table.slice(start, _BLOCK_ROWS)

    def _one(self, k: int, pa: Any):
        try:
            part = stages.prepare(self.job, self.tok, [self.job.inputs[k]], [self.names[k]], text_check=_refuse_images)
        except Exception as e:  # bad input: hand the error itself to the driver (Ray keeps only its text)
            summary = pickle.dumps({"error": pack_exc(e)}, protocol=5)
            return rows_table(pa, KIND_SHARD, k, np.array([-1]), {}, summary)
        samples, part.samples = part.samples, []
        lengths = np.fromiter((x.length for x in samples), dtype=np.int64, count=len(samples))
        summary: dict[str, Any] = {"prepared": part, "lengths": lengths}
        if self.planning == "global":
            cols = {
                "input_ids": list_column([x.input_ids for x in samples], pa, pa.int32()),
                "labels": list_column([x.labels for x in samples], pa, pa.int32()),
                "sample_ids": pa.array([[str(x.sample_id)] for x in samples], pa.large_list(pa.string())),
            }
            rows = rows_table(pa, KIND_ROW, k, np.arange(len(samples)), cols)
        elif not samples:
            rows = rows_table(pa, KIND_ROW, k, np.zeros(0, np.int64), {})
        else:
            plan = stages.plan(self.job, lengths)
            packs = [stages.build_row(self.job, [samples[int(i)] for i in b], self.tok.pad_token_id) for b in plan.bins]
            rows = pack_rows(pa, k, np.arange(len(packs)), packs)
            summary["plan"] = {"bins": [np.asarray(b, np.int64) for b in plan.bins], "lower_bound": int(plan.lower_bound)}
        head = rows_table(pa, KIND_SHARD, k, np.array([-1]), {}, pickle.dumps(summary, protocol=5))
        return pa.concat_tables([head, rows])


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




def _build_group(t, job: PackJob, pad_token_id: int):
    """Ray Data UDF (task) for ``map_groups``: build (and validate) every pack of one pack chunk."""
    import pyarrow as pa

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
    packs = [stages.build_row(job, samples[a:b], pad_token_id) for a, b in zip(starts.tolist(), ends.tolist())]
    return pack_rows(pa, 0, p_sorted[starts], packs).drop_columns(["summary"])


#: the :class:`PackJob` settings the Ray engine takes (image records and ``num_proc`` are local-engine settings).
RAY_JOB_SETTINGS = ("tokenizer", "seq_length", "algorithm", "pad_to_multiple_of", "context_parallel_size",
                    "overlength", "on_error", "train_on", "seed", "format", "overwrite", "rows_per_shard", "validate")


def pack_dataset_ray(
    inputs: Any = None,
    output: str | os.PathLike = "packed",
    *,
    progress: Any = None,
    log: Callable[[str], None] | None = None,
    num_cpus: int | None = None,
    planning: str = "global",
    packs_per_task: int = 512,
    ray_address: str | None = None,
    object_store_memory: int | None = None,
    **settings: Any,
):
    """Pack chat/instruction data on Ray Data (module docstring); drop-in for ``pack_dataset``.

    Args:
        inputs, output, progress, log: as :func:`seqpack.pipeline.pack_dataset`.
        **settings: the job settings of :func:`seqpack.pipeline.pack_dataset` named in
            :data:`RAY_JOB_SETTINGS` (same defaults, same meaning: :meth:`PackJob.create` holds them).
        num_cpus: CPUs for a local Ray runtime started here, and the most tokenizer actors used
            (default: every CPU of the cluster). Ignored for the size of an already running runtime.
        planning: ``"global"`` (packs identical to the local engine's) or ``"per_shard"`` (plan inside
            each input shard; the efficiency loss is recorded in ``metadata.extra["engine"]``).
        packs_per_task: packs built per Ray task in the global build stage.
        ray_address: connect to this cluster when Ray is not initialised yet (``None``: start a local
            runtime, or use the one already running).
        object_store_memory: object store size in bytes for a runtime started here (default 256 MiB;
            Ray spills to disk beyond it).

    Returns:
        :class:`seqpack.pipeline.PackResult`; ``timings_s`` has ``prepare`` (tokenize, parallel),
        ``plan``, ``write`` (build + write) and ``total``; ``metadata.extra["engine"]`` records the planning
        mode, worker count and (per-shard) the efficiency loss.

    Raises:
        TypeError: a setting the Ray engine does not take (``image_processor``, ``num_proc``, a typo).
        ImportError: Ray is not installed (says ``pip install "seqpack[ray]"``).
        PackConfigError: invalid settings or policies (as the local engine), or an unknown ``planning``.
        NothingToPackError: every record was dropped or skipped (nothing is written).
        FileExistsError: ``output`` exists and ``overwrite`` is False, or another run is writing it
            (``seqpack.io.OutputBusyError``); checked before starting Ray.
        DataFormatError / OverlengthError / FileNotFoundError: bad inputs, re-raised from the worker with
            the local engine's message (file, record, fix).
    """
    unknown = sorted(set(settings) - set(RAY_JOB_SETTINGS))
    if unknown:
        raise TypeError(f"pack_dataset_ray() does not take {', '.join(unknown)}: image records and num_proc are "
                        f"settings of the local engine (seqpack.pipeline.pack_dataset); the job settings it takes are "
                        f"{', '.join(RAY_JOB_SETTINGS)}")
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    bars = stages.Progress(progress)
    if planning not in PLANNING_MODES:
        raise PackConfigError(f"planning={planning!r} is not a planning mode; choose one of: {', '.join(PLANNING_MODES)}")
    if int(packs_per_task) < 1:
        raise PackConfigError(f"packs_per_task must be >= 1, got {packs_per_task}")
    job = PackJob.create(inputs, output, log=log, **settings)
    require_ray()
    from ray.data.expressions import col

    items, names = job.inputs, stages.input_names(job)
    tok = stages.open_tokenizer(job)
    # the output's lock: until published or failed; removes what killed runs left
    with lock_output(job.output), ray_runtime(num_cpus, object_store_memory, ray_address) as ray:
        workers = num_workers(ray, num_cpus, len(items))
        say(f"ray: {len(items)} input shard(s) on {workers} tokenizer worker(s), planning={planning}")
        cpus = int(ray.cluster_resources().get("CPU", 1))
        if len(items) < cpus:
            say(f"ray: only {len(items)} input file(s) for {cpus} CPUs; one file is one tokenize task, so split "
                "the corpus into more files (e.g. `split -l 10000 big.jsonl part-` and rename to .jsonl) to use them all")
        bars("prepare", 0, len(items))
        # ---- 1. prepare in parallel (one task per input file)
        try:
            tokenized = (
                ray.data.from_items([{"shard": k} for k in range(len(items))], override_num_blocks=len(items))
                .map_batches(
                    _ShardWorker, batch_size=1,
                    fn_constructor_kwargs={"job": job, "names": names, "planning": planning},
                    compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1,
                )
                .materialize()
            )
            summaries: dict[int, dict[str, Any]] = {}
            heads = tokenized.filter(expr=col("kind") == KIND_SHARD).select_columns(["shard", "summary"])
            for b in heads.iter_batches(batch_format="pyarrow", batch_size=None):
                for k, blob in zip(b.column("shard").to_pylist(), b.column("summary").to_pylist()):
                    summaries[int(k)] = pickle.loads(blob)
        except Exception as e:  # surface the worker's own error (file, record, fix)
            inner = unwrap(e)
            if inner is e:
                raise
            raise inner from None
        bars("prepare", len(items), len(items))
        for k in range(len(items)):  # the first bad shard in input order, as the local engine would
            if "error" in summaries[k]:
                raise unpack_exc(summaries[k]["error"])
        totals = stages.PrepareTotals()
        for k in range(len(items)):
            totals.add(summaries[k]["prepared"])
        report = totals.finish()
        shard_lengths = [summaries[k]["lengths"] for k in range(len(items))]
        lengths = np.concatenate(shard_lengths) if shard_lengths else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in shard_lengths])]).astype(np.int64)
        t_prep = time.perf_counter()
        stages.check_prepared(job, report, totals.sources, len(lengths), totals.stats, say)

        # ---- 2. plan: globally (the local engine's packs), or the shards' own plans
        global_plan = stages.plan(job, lengths, bars)
        ray_info: dict[str, Any] = {"name": "ray", "planning": planning, "workers": workers, "input_shards": len(items)}
        plan = global_plan if planning == "global" else _per_shard_plan(job, summaries, offsets, lengths, global_plan, ray_info, say)
        t_plan = time.perf_counter()

        # ---- 3. build rows (parallel) and 4. write in pack order
        rows_ds = tokenized.filter(expr=col("kind") == KIND_ROW)
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
                .map_groups(_build_group, fn_kwargs={"job": job, "pad_token_id": tok.pad_token_id},
                            batch_format="pyarrow")
            )
            first_pack = np.zeros(1, np.int64)  # built rows carry shard 0 and local = global pack id
        else:
            built = rows_ds
            per = [len(summaries[k]["plan"]["bins"]) if summaries[k].get("plan") else 0 for k in range(len(items))]
            first_pack = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)

        num_packs = int(plan.num_bins)
        settings = job.metadata_settings(
            tokenizer_hash=tok.files_sha256, chat_template_hash=tok.chat_template_sha256, pad_token_id=tok.pad_token_id
        )
        meta = build_metadata(
            lengths=lengths, trainable_tokens=int(report.trainable_tokens), bins=plan.bins,
            lower_bound=int(global_plan.lower_bound), report=report, settings=settings,
            described_inputs=[describe_input(i) for i in items], tokenizer_name=tok.name,
            # per-shard planning gives different packs from the same inputs: a different fingerprint
            fingerprint_extra={"planning": "per_shard"} if planning == "per_shard" else None,
        )
        meta.extra["engine"] = ray_info  # the one part of metadata.json the local engine has not

        def rows() -> Iterator[Any]:
            bars("write", 0, num_packs)
            for written, row in enumerate(iter_pack_rows(built, first_pack, num_packs), 1):
                yield row
                if written % 64 == 0:
                    bars("write", written, num_packs)

        try:
            meta = stages.write(job, rows(), meta, report.entries)
        except Exception as e:
            inner = unwrap(e)
            if inner is e:
                raise
            raise inner from None
        bars("write", num_packs, num_packs)
    t_end = time.perf_counter()
    say(f"wrote {num_packs} packs to {job.output}")
    return PackResult(job.output, meta, report, plan, stages.timings(t0, t_prep, t_plan, t_end))


def _per_shard_plan(
    job: PackJob, summaries: dict[int, dict[str, Any]], offsets: np.ndarray, lengths: np.ndarray,
    global_plan: PackingPlan, ray_info: dict[str, Any], say: Callable[[str], None],
) -> PackingPlan:
    """The shards' own plans as one plan over the job's samples; records the efficiency lost against
    ``global_plan`` in ``ray_info`` (``metadata.extra["engine"]``)."""
    m, cap = job.pad_multiple, job.seq_length
    bins, lb = [], 0
    for k in range(len(summaries)):
        p = summaries[k].get("plan")
        if p is None:
            continue
        bins.extend(offsets[k] + b for b in p["bins"])
        lb += p["lower_bound"]
    loads = np.array([int((-(-lengths[b] // m) * m).sum()) for b in bins], dtype=np.int64)
    plan = PackingPlan(
        bins=bins, num_bins=len(bins), lower_bound=int(global_plan.lower_bound),
        utilization=float(lengths.sum() / (len(bins) * cap)), bin_loads=loads, algorithm=job.algorithm,
        capacity=int(cap), pad_to_multiple_of=int(m), detail={"per_shard_lower_bound_sum": lb},
    )
    eff_g = float(lengths.sum() / (global_plan.num_bins * cap))
    eff_s = float(lengths.sum() / (plan.num_bins * cap))
    ray_info.update(
        global_num_packs=int(global_plan.num_bins), per_shard_num_packs=int(plan.num_bins),
        global_packing_efficiency=round(eff_g, 6), per_shard_packing_efficiency=round(eff_s, 6),
        efficiency_loss=round(eff_g - eff_s, 6),
    )
    say(f"per-shard planning: {plan.num_bins} packs vs {global_plan.num_bins} with global planning "
        f"(efficiency {eff_s:.4f} vs {eff_g:.4f}, loss {eff_g - eff_s:.4f})")
    stages.check_plan_places_all(plan, len(lengths), f"{job.algorithm.value}, planning=per_shard")
    return plan
