"""The band schedule, the first candidate of :func:`~seqpack.parallel.balance.balance_samples`: even pack
loads first, then steps cut from packs sorted by attention cost. Linear in the number of samples after
packing (numba kernels in :mod:`seqpack.parallel.balance._band_kernels`).

1. **Pool.** The extra empty packs (to make the pack count a multiple of ``dp_size``) pool their
   room with the lowest-cost packs (short samples), re-packed by LPT into as many packs.
2. **Even loads.** Every pack is brought within ``delta`` units of the capacity (pool packs: of
   their mean), ``delta`` being the largest deficit that keeps a step's token spread below 0.9 x
   ``token_tolerance``: a pack short of it swaps a sample for one a few units longer from any pack
   with room to give (length-matched swaps through a length index; attention cost moves by
   ``2 * len * d``); a pack still short takes in a short sample whose old pack evens out by swaps.
3. **Bands.** Packs in decreasing cost (``formation="deficit"``: by deficit class first) are cut
   into steps of ``dp_size * micro_batches``; each step's packs are dealt to ranks by vector LPT.
   Packs of a band hold about the same cost, so the cost max/mean of a step is close to 1.
   "Rigid" packs (one sample, or not evened) of a step must share one load window: a clashing one
   trades places with a pack of about its cost in a later step, and the other packs of its step
   move to its window by the same swaps. A swap with no partner that has room to give or take goes
   through a middle pack (two hops: ``p`` swaps with any pack ``q``, ``q`` evens out with a pack ``r``).
4. **Pack trades.** Full steps still above the token goal trade whole packs of near cost with other
   full steps (:func:`~seqpack.parallel.balance._exchange_kernels.exchange_packs`: only trades that
   lower the two steps' summed token excess, raise neither, and keep both cost max/mean within
   ``max(own, min(plan's worst, 1 + cost_tolerance / 4))``); the steps still off get new windows and swaps (up to ``_ROUNDS`` rounds).
5. **Relocation** (:func:`_relocate`). A step still off trades each pack outside its window with a pack
   of near cost of an on-target step when both then reach their new window by swaps (undone otherwise).
6. **Chains** (:func:`~seqpack.parallel.balance.chains.chain_steps`, after the sample-level leveling of
   :func:`band_then_level`): a step still above the token goal brings each rank outside a window by a
   chain of up to three sample swaps or moves through packs of other steps (undone unless it fits).
"""

from __future__ import annotations

import numpy as np

from seqpack.parallel.balance import _band_kernels as BK
from seqpack.parallel.balance import _exchange_kernels as EK
from seqpack.parallel.balance import _kernels as K
from seqpack.parallel.balance.chains import chain_steps
from seqpack.parallel.balance.cost import pack_sums, score_parts, step_figures
from seqpack.parallel.balance.leveling import level
from seqpack.parallel.balance.schedule import (
    FILLER,
    is_full,
    renumber_packs,
    order_steps,
    step_loads,
    step_shape,
)

_GUARD = 0.9  # the token spread aimed at, as a fraction of token_tolerance
_KMAX = 16  # candidates tried per (sample, length) by the length-matched swaps
_DLIM = 64  # largest length difference of one swap (units)
_XWINDOW = 2048  # packs of nearest cost a pack may trade places with (cross-step exchange)
_XCOST = 0.25  # a trade never raises a step's cost max/mean above max(its own, 1 + this x cost_tolerance)
_ROUNDS = 3  # rounds of (pack trades, re-windowing, swaps) for the steps still off target
_HOPS = 256  # first swaps tried per two-hop attempt (a change passed on through a middle pack)
_RWIN = 64  # packs of nearest cost (either side) a pack of a step still off target may trade places with
_RTRIES = 200  # trades tried (each evened and undone unless it fits) for the steps still off target


def band_delta(load: float, tt: float) -> int:
    """The largest per-pack deficit (units) at ``load`` units that keeps a step's spread <= 0.9 x ``tt``."""
    g = _GUARD * tt
    return max(0, int(np.floor(g * load / (1.0 + g))))


def _csr(pack_of: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mstart, mem, pos_of)``: members of pack ``p`` are ``mem[mstart[p]:mstart[p+1]]``."""
    mem = np.argsort(pack_of, kind="stable").astype(np.int64)
    mstart = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(pack_of, minlength=count), out=mstart[1:])
    pos_of = np.empty(pack_of.shape[0], dtype=np.int64)
    pos_of[mem] = np.arange(pack_of.shape[0], dtype=np.int64)
    return mstart, mem, pos_of


def _order(ids, tok, cost, delta, formation):
    if formation == "deficit":
        cls = (int(tok.max()) - tok[ids]) // (delta + 1) if ids.size else ids
        return ids[np.lexsort((-tok[ids], -cost[ids], cls))]
    return ids[np.lexsort((-tok[ids], -cost[ids]))]


def band_schedule(bins, padded, capacity, pad, dp, mb, seed, shuffle_steps, tt, ct, formation):
    """The band schedule of ``bins`` (packs of sample indices) with the extra packs that make their count a
    multiple of ``dp``. Returns ``(bins, grids)`` (packs left empty dropped, their slots
    :data:`FILLER`) or None when it does not fit (e.g. the pool cannot be re-packed under the cap)."""
    n = padded.shape[0]
    if n == 0 or not bins:
        return None
    units = (padded // pad).astype(np.int64)
    cap_u = int(capacity // pad)
    p0 = len(bins)
    npk = p0 + (-p0) % dp
    g = dp * mb
    pack_of = np.empty(n, dtype=np.int64)
    pack_of[np.concatenate(bins)] = np.repeat(np.arange(p0, dtype=np.int64), [b.size for b in bins])
    cost = np.bincount(pack_of, weights=units.astype(np.float64) ** 2, minlength=npk)
    pool = np.zeros(0, dtype=np.int64)
    if npk > p0:  # the extra packs pool with the lowest-cost packs, re-packed by LPT into even loads
        want = 5 * (npk - p0)
        count = min(want + (npk - want) % g, npk)
        pool = np.concatenate([np.argsort(cost[:p0], kind="stable")[:count - (npk - p0)], np.arange(p0, npk)])
        members = np.flatnonzero(np.isin(pack_of, pool))
        order = members[np.argsort(-units[members], kind="stable")].astype(np.int64)
        bin_of = np.full(n, -1, dtype=np.int64)
        if not K.lpt_fixed(order, units, int(pool.size), cap_u, bin_of):
            return None
        pack_of[order] = pool[bin_of[order]]
        cost = np.bincount(pack_of, weights=units.astype(np.float64) ** 2, minlength=npk)
    load = np.bincount(pack_of, weights=units, minlength=npk).astype(np.int64)
    in_pool = np.zeros(npk, dtype=bool)
    in_pool[pool] = True
    main = np.flatnonzero(~in_pool)
    pool = np.flatnonzero(in_pool)
    delta = band_delta(cap_u, tt)
    # even the loads: main packs to within delta of the capacity, pool packs to within delta of their mean
    lo = np.full(npk, cap_u - delta, dtype=np.int64)
    hi = np.full(npk, cap_u, dtype=np.int64)
    if pool.size:
        mean = float(load[pool].sum()) / pool.size
        d_p = band_delta(mean, tt)
        lo[pool] = int(np.floor(mean)) - d_p // 2
        hi[pool] = min(int(np.floor(mean)) - d_p // 2 + d_p, cap_u)
    srt = np.argsort(units, kind="stable").astype(np.int64)
    vstart = np.searchsorted(units[srt], np.arange(cap_u + 2)).astype(np.int64)
    mstart, mem, pos_of = _csr(pack_of, npk)
    todo = np.flatnonzero((load < lo) | (load > hi)).astype(np.int64)
    BK.smooth_loads(todo, units, pack_of, load, mstart, mem, pos_of, lo, hi, srt, vstart, cap_u, _DLIM, _KMAX, seed, _HOPS)
    out = np.flatnonzero(load < lo)
    if out.size:  # a pack still short: move in a short sample, its old pack (>= 3 samples) evens out by swaps
        count = np.bincount(pack_of, minlength=npk)
        gave = []
        for p in out:
            for ln in range(hi[p] - load[p], max(lo[p] - load[p], 1) - 1, -1):
                for j in srt[vstart[ln]:vstart[ln + 1]]:
                    r = pack_of[j]
                    if r != p and count[r] >= 3 and in_pool[r] == in_pool[p]:
                        pack_of[j] = p
                        load[p] += ln
                        load[r] -= ln
                        count[p] += 1
                        count[r] -= 1
                        gave.append(r)
                        break
                if load[p] >= lo[p]:
                    break
        if gave:
            mstart, mem, pos_of = _csr(pack_of, npk)
            BK.smooth_loads(np.unique(np.array(gave, dtype=np.int64)), units, pack_of, load, mstart, mem, pos_of,
                            lo, hi, srt, vstart, cap_u, _DLIM, _KMAX, seed + 2, _HOPS)
    # rigid: one-sample packs and packs the swaps could not even; those of one step must share a load window
    rigid = ((load < lo) | (load > hi) | (np.bincount(pack_of, minlength=npk) == 1)).astype(np.int64)
    cost = np.bincount(pack_of, weights=units.astype(np.float64) ** 2, minlength=npk)
    shape = np.array(step_shape(npk, dp, mb), dtype=np.int64)
    sizes = dp * shape
    off = np.concatenate([[0], np.cumsum(sizes)])
    tok = load.astype(np.float64)
    best = None
    for form in (("cost", "deficit") if formation == "auto" else (formation,)):
        order = np.concatenate([_order(main, load, cost, delta, form), _order(pool, load, cost, delta, form)])
        order = order.astype(np.int64)
        if rigid.any():
            BK.spread_rigid(order, rigid, load, cost, sizes, delta, 0.5 * ct)
        flat = np.empty(int(sizes.sum()), dtype=np.int64)
        BK.assign_bands(order, tok, cost, dp, shape, flat)
        grids = [flat[off[s]:off[s + 1]].reshape(dp, shape[s]).copy() for s in range(shape.size)]
        full = [gr for gr in grids if is_full(gr, mb)] or grids
        tl = np.stack([np.where(gr == FILLER, 0.0, tok[gr]).sum(1) for gr in full])
        cl = np.stack([np.where(gr == FILLER, 0.0, cost[gr]).sum(1) for gr in full])
        tp, cp = score_parts(tl, cl, tt, ct)
        worst = (float(cp.max()), float(tp.max()))  # tokens are evened next; cost stays as formed
        if best is None or worst < best[0]:
            best = (worst, grids, flat)
    _, grids, flat = best
    if rigid.any():  # a step holding a rigid pack: the others move to its load window
        BK.step_bands(flat, sizes, load, rigid, delta, cap_u, lo, hi)
        todo = np.flatnonzero((load < lo) | (load > hi)).astype(np.int64)
        BK.smooth_loads(todo, units, pack_of, load, mstart, mem, pos_of, lo, hi, srt, vstart, cap_u, _DLIM, _KMAX,
                        seed + 1, _HOPS)
    for rnd in range(_ROUNDS):  # steps still off: whole packs trade places, then the rest re-windowed
        cost = np.bincount(pack_of, weights=units.astype(np.float64) ** 2, minlength=npk)
        still = _trade_packs(grids, load, cost, dp, mb, tt, ct)
        if still.size == 0:
            break
        sub = np.concatenate([grids[k].reshape(-1) for k in still]).astype(np.int64)
        rigid |= ((load < lo) | (load > hi)).astype(np.int64)
        BK.step_bands(sub, np.full(still.size, dp * mb, dtype=np.int64), load, rigid, delta, cap_u, lo, hi)
        todo = sub[(load[sub] < lo[sub]) | (load[sub] > hi[sub])]
        if todo.size == 0:
            break
        BK.smooth_loads(todo, units, pack_of, load, mstart, mem, pos_of, lo, hi, srt, vstart, cap_u, _DLIM, _KMAX,
                        seed + 3 + rnd, _HOPS)
    cost = np.bincount(pack_of, weights=units.astype(np.float64) ** 2, minlength=npk)
    smooth = (units, pack_of, load, mstart, mem, pos_of, lo, hi, srt, vstart, cap_u, _DLIM, _KMAX)
    _relocate(grids, cost, np.bincount(pack_of, minlength=npk), smooth, dp, mb, tt, ct, delta, seed + 7)
    grids = order_steps(grids, mb, seed, shuffle_steps)
    return renumber_packs(pack_of, npk, grids)


def _relocate(grids, cost, count, smooth, dp, mb, tt, ct, delta, seed):
    """Full steps still above ``tt``: each gets the load window of most of its one-sample packs (then of most
    packs), and every pack ``o`` outside it trades places with a pack ``q`` of near cost (among the
    ``2 * _RWIN`` nearest) in a full step on target, when then ``q`` reaches the window and ``o`` the other
    step's window by length-matched swaps (:func:`~._band_kernels.smooth_loads`); a one-sample ``o`` that
    fits no window goes to a step of packs with several samples, which all move to a window around ``o``.
    A trade is undone unless every pack involved ends in its window and neither step's cost max/mean rises
    above ``max(its own, min(the plan's worst, 1 + ct / 2))``. ``grids`` and the ``smooth`` arrays
    (``units, pack_of, load, mstart, mem, pos_of, lo, hi, ...``) are updated in place."""
    full = np.flatnonzero([is_full(gr, mb) for gr in grids])
    if full.size < 2:
        return
    _, pack_of, load, _, mem, pos_of, lo, hi = smooth[:8]
    cap_u = smooth[10]
    grid = np.stack([grids[k] for k in full]).reshape(full.size, -1)  # [S, dp * mb], rank-major
    rank = np.arange(dp * mb) // mb

    def figures(row):
        t = np.bincount(rank, weights=load[row].astype(np.float64), minlength=dp)
        c = np.bincount(rank, weights=cost[row], minlength=dp)
        return (t.max() - t.min()) / max(t.mean(), 1e-12), c.max() / max(c.mean(), 1e-12)

    by_rank = grid.reshape(full.size, dp, mb)
    spread, ratio = step_figures(load[by_rank].sum(axis=2).astype(np.float64), cost[by_rank].sum(axis=2))
    is_off = spread > tt
    if not is_off.any():
        return
    cap = min(float(ratio.max()), 1.0 + 0.5 * ct)
    step_of = np.empty(cost.shape[0], dtype=np.int64)
    slot_of = np.empty(cost.shape[0], dtype=np.int64)
    step_of[grid.reshape(-1)] = np.repeat(np.arange(full.size), dp * mb)
    slot_of[grid.reshape(-1)] = np.tile(np.arange(dp * mb), full.size)
    by_cost = grid.reshape(-1)[np.argsort(cost[grid.reshape(-1)], kind="stable")]
    cpos = np.empty(cost.shape[0], dtype=np.int64)
    cpos[by_cost] = np.arange(by_cost.size)
    inside = lambda p: lo[p] <= load[p] <= hi[p]  # noqa: E731
    tries = [0]

    def attempt(s, o, q, t, win_t):
        """Trade ``o`` (step ``s``) and ``q`` (step ``t``); ``win_t``: t's new window or None (keep)."""
        tries[0] += 1
        snap = [arr.copy() for arr in (pack_of, load, mem, pos_of)]
        a, b = slot_of[o], slot_of[q]
        old_w = {p: (lo[p], hi[p]) for p in list(grid[s]) + list(grid[t])}
        grid[s, a], grid[t, b] = q, o
        lo[q], hi[q] = old_w[o]
        lo[o], hi[o] = old_w[q]
        if win_t is not None:
            lo[grid[t]], hi[grid[t]] = win_t
        todo = np.array([p for p in grid[t]] + [q], dtype=np.int64)
        todo = todo[[not inside(p) for p in todo]]
        if todo.size:
            BK.smooth_loads(todo, *smooth, seed + tries[0], _HOPS)
        fs, ft = figures(grid[s]), figures(grid[t])
        if (inside(q) and all(inside(p) for p in grid[t]) and fs[1] <= max(ratio[s], cap)
                and ft[1] <= max(ratio[t], cap) and ft[0] <= tt):
            spread[s], ratio[s] = fs
            spread[t], ratio[t] = ft
            slot_of[o], slot_of[q], step_of[o], step_of[q] = b, a, t, s
            return True
        grid[s, a], grid[t, b] = o, q  # undo
        for p, (x, y) in old_w.items():
            lo[p], hi[p] = x, y
        for arr, old in zip((pack_of, load, mem, pos_of), snap):
            arr[:] = old
        return False

    def cost_ok(s, o, q, t):
        """Neither step's cost max/mean above max(its own, cap) once ``o`` and ``q`` trade (before evening)."""
        rs, rt = grid[s].copy(), grid[t].copy()
        rs[slot_of[o]], rt[slot_of[q]] = q, o
        return figures(rs)[1] <= max(ratio[s], cap) and figures(rt)[1] <= max(ratio[t], cap)

    rigid = (count < 2).astype(np.int64)
    for s in np.flatnonzero(is_off):
        BK.step_bands(grid[s].copy(), np.array([dp * mb], dtype=np.int64), load, rigid, delta, cap_u, lo, hi)
        for o in [p for p in grid[s] if not inside(p)]:
            c0 = cpos[o]
            done = False
            for x in sorted(range(max(c0 - _RWIN, 0), min(c0 + _RWIN + 1, by_cost.size)), key=lambda y: abs(y - c0)):
                q = by_cost[x]  # q's step keeps its window; o must fit it (or be evened into it)
                t = step_of[q]
                if tries[0] > _RTRIES:
                    break
                if t == s or is_off[t] or (count[q] < 2 and not lo[o] <= load[q] <= hi[o]):
                    continue
                if count[o] < 2 and not lo[q] <= load[o] <= hi[q]:
                    continue
                if cost_ok(s, o, q, t) and attempt(s, o, q, t, None):
                    done = True
                    break
            if done or count[o] >= 2:
                continue
            # a one-sample o: a step whose packs can all move to o's window (those that cannot already in it)
            a0 = max(min(int(load[o]) - delta // 2, cap_u - delta), 0)
            seen = {s}
            for x in sorted(range(max(c0 - 16 * _RWIN, 0), min(c0 + 16 * _RWIN + 1, by_cost.size)),
                            key=lambda y: abs(y - c0)):
                q = by_cost[x]
                t = step_of[q]
                if tries[0] > _RTRIES or len(seen) > 4 * _RWIN:
                    break
                if t in seen or is_off[t]:
                    continue
                seen.add(t)
                fixed = grid[t][(count[grid[t]] < 2) & (grid[t] != q)]
                if np.any((load[fixed] < a0) | (load[fixed] > a0 + delta)) or not cost_ok(s, o, q, t):
                    continue
                if attempt(s, o, q, t, (a0, a0 + delta)):
                    break
    for i, k in enumerate(full):
        grids[k] = grid[i].reshape(dp, mb)


def _trade_packs(grids, load, cost, dp, mb, tt, ct):
    """Whole packs trade places between full steps (:func:`~._exchange_kernels.exchange_packs`) for the full
    steps whose token spread is above ``tt``; ``grids`` updated in place. Returns the indices (into
    ``grids``) of the full steps still above ``tt``."""
    full = np.flatnonzero([is_full(gr, mb) for gr in grids])
    if full.size < 2:
        return np.zeros(0, dtype=np.int64)
    tok = load.astype(np.float64)
    grid = np.stack([grids[k] for k in full])
    spread, ratio = step_figures(tok[grid].sum(axis=2), cost[grid].sum(axis=2))
    if not np.any(spread > tt):
        return np.zeros(0, dtype=np.int64)
    cap = min(float(ratio.max()), 1.0 + _XCOST * ct)  # trades never raise the plan's worst cost figure
    by_cost = grid.reshape(-1)[np.argsort(cost[grid.reshape(-1)], kind="stable")]
    EK.exchange_packs(grid, tok, cost, spread > tt, by_cost, _GUARD * tt, cap, _XWINDOW, 4 * dp * mb)
    for i, k in enumerate(full):
        grids[k] = grid[i]
    spread, _ = step_figures(tok[grid].sum(axis=2), cost[grid].sum(axis=2))
    return full[spread > tt]


def band_then_level(bins, padded, capacity, pad, dp, mb, seed, shuffle_steps, tt, ct, stop, max_iter, cross_iters,
                    formation):
    """:func:`band_schedule`, then the steps still off target (token spread above ``tt`` or cost max/mean
    above ``1 + ct``) leveled sample by sample (:func:`~seqpack.parallel.balance.leveling.level`; the
    others stay as they are, partners of its cross-step swaps), then the ejection chains
    (:func:`~seqpack.parallel.balance.chains.chain_steps`) for those still above ``tt``. Returns
    ``(bins, grids)`` or None."""
    got = band_schedule(bins, padded, capacity, pad, dp, mb, seed, shuffle_steps, tt, ct, formation)
    if got is None:
        return None
    new_bins, grids = got
    units = (padded // pad).astype(np.float64)
    tok, cost = pack_sums(new_bins, units), pack_sums(new_bins, units ** 2)
    spread, ratio = step_figures(step_loads(grids, tok), step_loads(grids, cost))
    active = (spread > tt) | (ratio > 1.0 + ct)
    if not active.any():
        return new_bins, grids
    new_bins, grids = level(new_bins, grids, padded, capacity, pad, dp, mb, tt, ct, stop, max_iter, cross_iters, seed,
                            active)
    return chain_steps(new_bins, grids, padded, capacity, pad, dp, mb, tt, ct), grids
