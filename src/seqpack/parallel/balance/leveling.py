"""Sample-level leveling: the candidate schedules :func:`~seqpack.parallel.balance.balance_samples` tries,
and :func:`level`, which runs the numba local search (:mod:`seqpack.parallel.balance._kernels`) on one.

Samples are measured in pad units (``padded // pad_to_multiple_of``), their cost is ``units**2``.
"""

from __future__ import annotations

import numpy as np

from seqpack.parallel.balance import _kernels as K
from seqpack.parallel.balance.cost import pack_costs
from seqpack.parallel.balance.packs import balance_packs
from seqpack.parallel.balance.schedule import FILLER, is_full, members_by_owner, order_steps, renumber_packs


def level(bins, grids, padded, capacity, pad, dp, mb, tt, ct, stop, max_iter, cross_iters, seed, active=None):
    """Sample-level leveling of a pack schedule: moves and swaps samples between packs, never above ``capacity``.

    ``bins``: packs (int64 sample indices, may be empty); ``grids``: step grids ``[dp, m]`` of pack ids;
    ``padded``: int64 [n] lengths rounded up to ``pad``. ``cross_iters``: budget of cross-step repairs;
    None = ``4 * number of steps + 200``. ``active``: bool [steps], the steps leveled and repaired (None =
    all; the others are still partners of cross-step swaps). Returns ``(bins, grids)`` with packs left
    empty dropped (their slots become :data:`FILLER`)."""
    active = np.ones(len(grids), dtype=np.bool_) if active is None else np.asarray(active, dtype=np.bool_)
    cross_iters = 4 * int(active.sum()) + 200 if cross_iters is None else int(cross_iters)
    n = padded.shape[0]
    units = (padded // pad).astype(np.int64)
    cs = units.astype(np.float64) ** 2
    npk = len(bins)
    cap_u = int(capacity // pad)
    pack_of = np.empty(n, dtype=np.int64)
    for k, b in enumerate(bins):
        pack_of[b] = k
    pack_rank = np.zeros(npk, dtype=np.int64)
    pack_step = np.zeros(npk, dtype=np.int64)
    for s, g in enumerate(grids):
        for r in range(g.shape[0]):
            for m in range(g.shape[1]):
                pid = int(g[r, m])
                if pid != FILLER:
                    pack_rank[pid] = r
                    pack_step[pid] = s
    pack_load = np.bincount(pack_of, weights=units, minlength=npk).astype(np.int64)
    S = len(grids)
    step_of = pack_step[pack_of]
    order = np.argsort(step_of, kind="stable").astype(np.int64)
    mstart = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(np.bincount(step_of, minlength=S), out=mstart[1:])
    pos_of = np.empty(n, dtype=np.int64)
    pos_of[order] = np.arange(n, dtype=np.int64)
    RT = np.zeros((S, dp))
    RC = np.zeros((S, dp))
    np.add.at(RT, (step_of, pack_rank[pack_of]), units.astype(np.float64))
    np.add.at(RC, (step_of, pack_rank[pack_of]), cs)
    pstart = np.zeros(S + 1, dtype=np.int64)  # packs of step s: pack_ids[pstart[s]:pstart[s+1]]
    np.cumsum([int(np.sum(g != FILLER)) for g in grids], out=pstart[1:])
    pack_ids = np.concatenate([g[g != FILLER].reshape(-1) for g in grids]).astype(np.int64) if S else np.zeros(0,
                                                                                                           np.int64)
    full = np.array([g.shape[1] == mb for g in grids], dtype=np.bool_)
    K.level_all(order, mstart, pack_ids, pstart, units, cs, pack_of, pack_rank, pack_load, RT, RC, cap_u, tt, ct,
                stop, max_iter, active)
    if cross_iters > 0 and int(full.sum()) > 1:
        srt = np.argsort(units, kind="stable").astype(np.int64)
        vstart = np.searchsorted(units[srt], np.arange(cap_u + 2)).astype(np.int64)
        K.repair_cross(order, mstart, pos_of, pack_ids, pstart, units, cs, pack_of, pack_rank, pack_step,
                       pack_load, RT, RC, full, srt, vstart, cap_u, tt, ct, stop, cross_iters, max_iter, seed,
                       active)
    return renumber_packs(pack_of, npk, grids)  # packs left empty -> fillers


def _pool_then_level(bins, padded, capacity, pad, dp, mb, seed, shuffle_steps, tt, ct, stop, max_iter, cross_iters,
                     formation, pool_fraction=0.0):
    """The "pool" candidate: packs within ``stop * tt`` of the capacity are scheduled among themselves
    (their tokens already agree); all other packs (and the extra empty ones) pool their samples, which
    are re-packed into the same number of packs by LPT so that the slack is spread evenly; both groups
    are scheduled with :func:`~seqpack.parallel.balance.balance_packs`, then everything is leveled.

    ``pool_fraction``: also pool an even sample (in cost order) of the full packs, until the pooled packs
    are that fraction of all packs. Returns ``(bins, grids)`` or None when this start does not apply or does not fit."""
    units = (padded // pad).astype(np.int64)
    cap_u = int(capacity // pad)
    g = dp * mb
    loads = np.array([int(units[b].sum()) for b in bins], dtype=np.int64)
    delta = int(np.floor(stop * tt * cap_u))
    near = np.flatnonzero(loads >= cap_u - delta)
    near = near[np.argsort(-loads[near], kind="stable")]
    if pool_fraction > 0 and near.size:  # also pool an even sample (in cost order) of the full packs
        want = max(0, int(pool_fraction * len(bins)) - (len(bins) - near.size))
        if want:
            cst = np.array([float(np.sum(units[bins[k]].astype(np.float64) ** 2)) for k in near])
            byc = near[np.argsort(-cst, kind="stable")]
            take = np.unique(np.linspace(0, byc.size - 1, min(want, byc.size)).round().astype(np.int64))
            mask = np.ones(byc.size, dtype=bool)
            mask[take] = False
            near = byc[mask]
    keep = (near.size // g) * g
    if keep == len(bins):
        return None
    near_ids, loose_ids = near[:keep], np.setdiff1d(np.arange(len(bins)), near[:keep])
    pool = np.concatenate([bins[k] for k in loose_ids]) if loose_ids.size else np.zeros(0, np.int64)
    order = pool[np.argsort(-units[pool], kind="stable")].astype(np.int64)
    bin_of = np.full(padded.shape[0], -1, dtype=np.int64)
    if not K.lpt_fixed(order, units, int(loose_ids.size), cap_u, bin_of):
        return None
    loose_bins = [np.sort(pool[m]) for m in members_by_owner(bin_of[pool], int(loose_ids.size))]
    near_bins = [bins[k] for k in near_ids]
    all_bins = near_bins + loose_bins
    grids = []
    for group, off in ((near_bins, 0), (loose_bins, len(near_bins))):
        tokens, cost = pack_costs(group, padded)
        sch = balance_packs(tokens, cost, dp, mb, token_cap=int(capacity), seed=seed, shuffle_steps=False,
                            token_tolerance=tt, cost_tolerance=ct, formation=formation)
        grids += [np.where(gr == FILLER, FILLER, gr + off) for gr in sch.steps]
    if sum(not is_full(gr, mb) for gr in grids) > 1:  # both groups left a partial step
        return None
    grids = order_steps(grids, mb, seed, shuffle_steps)
    return level(all_bins, grids, padded, capacity, pad, dp, mb, tt, ct, stop, max_iter, cross_iters, seed)


def pack_then_level(bins, padded, capacity, pad, dp, mb, sand_fraction, seed, shuffle_steps, tt, ct, stop,
                    max_iter, cross_iters, formation="cost"):
    """One candidate start of :func:`~seqpack.parallel.balance.balance_samples`, then leveled.

    ``sand_fraction >= 0``: lift out the shortest samples ("sand", up to that fraction of the tokens),
    schedule the remaining packs, pour the sand back where a step's ranks are lowest. ``-1`` / ``-2``:
    the "pool" start (:func:`_pool_then_level`; ``-2`` also pools 10 % of the full packs).
    Returns ``(bins, grids)`` or None when the start does not fit (e.g. the sand fits nowhere)."""
    n = padded.shape[0]
    if sand_fraction < 0:
        return _pool_then_level(bins, padded, capacity, pad, dp, mb, seed, shuffle_steps, tt, ct, stop, max_iter,
                                cross_iters, formation, 0.1 if sand_fraction < -1.5 else 0.0)
    sand = np.zeros(0, dtype=np.int64)
    if sand_fraction > 0 and n:
        order = np.argsort(padded, kind="stable")
        cum = np.cumsum(padded[order])
        k = int(np.searchsorted(cum, sand_fraction * float(cum[-1]), side="right"))
        sand = order[:k]
        small = padded[sand] <= capacity // 4
        sand = sand[small]
        if sand.size == 0:
            return None
        is_sand = np.zeros(n, dtype=bool)
        is_sand[sand] = True
        bins = [b[~is_sand[b]] for b in bins]
    tokens, cost = pack_costs(bins, padded)
    sched = balance_packs(tokens, cost, dp, mb, token_cap=int(capacity), seed=seed, shuffle_steps=shuffle_steps,
                          token_tolerance=tt, cost_tolerance=ct, formation=formation)
    grids = [g.copy() for g in sched.steps]
    if sand.size:
        units = (padded // pad).astype(np.int64)
        pack_of = np.full(n, -1, dtype=np.int64)
        for k2, b in enumerate(bins):
            pack_of[b] = k2
        pack_load = np.array([int(units[b].sum()) for b in bins], dtype=np.int64)
        nbin = sum(g.shape[0] for g in grids)
        bin_packs = np.zeros((nbin, mb), dtype=np.int64)
        mb_of_bin = np.zeros(nbin, dtype=np.int64)
        bin_step = np.zeros(nbin, dtype=np.int64)
        load = np.zeros(nbin)
        kk = 0
        for si, g in enumerate(grids):
            for r in range(g.shape[0]):
                row = g[r][g[r] != FILLER]
                mb_of_bin[kk] = row.size
                bin_packs[kk, :row.size] = row
                bin_step[kk] = si
                load[kk] = float(pack_load[row].sum())
                kk += 1
        step_max = np.array([load[bin_step == si].max() for si in range(len(grids))])
        srt = sand[np.argsort(-padded[sand], kind="stable")].astype(np.int64)
        if not K.pour_sand(srt, units, pack_of, pack_load, bin_packs, mb_of_bin, bin_step, load, step_max,
                           int(capacity // pad)):
            return None
        bins = members_by_owner(pack_of, len(bins))
    return level(bins, grids, padded, capacity, pad, dp, mb, tt, ct, stop, max_iter, cross_iters, seed)
