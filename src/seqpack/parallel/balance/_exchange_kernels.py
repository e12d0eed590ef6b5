"""numba kernel of the cross-step pack exchange (:func:`exchange_packs`): whole packs trade places between
full steps so that a step whose packs cannot be evened sample by sample (one-document packs, packs of a
few long samples) gets packs whose loads fit its own.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _excess(row, allow):
    """Token excess of one step: ``sum over rank pairs of max(0, |a - b| - allow)`` (0 = spread within allow)."""
    e = 0.0
    n = row.shape[0]
    for a in range(n):
        for b in range(a + 1, n):
            d = abs(row[a] - row[b]) - allow
            if d > 0:
                e += d
    return e


@njit(cache=True)
def _ratio(row):
    """Cost max / mean of one step's ranks (mean floored at 1e-12)."""
    return row.max() / max(row.mean(), 1e-12)


@njit(cache=True)
def exchange_packs(grid, tok, cost, active, by_cost, tt, cost_cap, window, max_rounds):
    """In place on ``grid`` (int64 ``[S, dp, mb]`` pack ids of the full steps): each ``active`` step trades
    packs with other full steps until its token spread is within ``tt`` or no trade helps.

    A trade exchanges a pack ``o`` of the step's heaviest or lightest rank with a pack ``q`` of another
    step whose attention cost is among the ``window`` nearest to ``o``'s (``by_cost``: the packs of
    ``grid`` sorted by cost). It is kept only when it lowers the two steps' summed token excess (over
    rank pairs, ``sum max(0, |a - b| - tt * mean)``: zero exactly when the step's spread
    ``(max - min) / mean`` is within ``tt``), raises neither step's excess, and leaves neither step's
    cost max/mean above ``max(its old value, cost_cap)``; the best such trade is made, up to
    ``max_rounds`` per step. ``tok``/``cost``: float64 [P] per pack. Work: O(active steps x rounds x
    2 mb x window x dp**2). Returns the number of active steps still above ``tt``."""
    S = grid.shape[0]
    dp = grid.shape[1]
    mb = grid.shape[2]
    P = tok.shape[0]
    step_of = np.full(P, -1, dtype=np.int64)
    slot_of = np.full(P, -1, dtype=np.int64)
    RT = np.zeros((S, dp))
    RC = np.zeros((S, dp))
    for s in range(S):
        for r in range(dp):
            for m in range(mb):
                p = grid[s, r, m]
                step_of[p] = s
                slot_of[p] = r * mb + m
                RT[s, r] += tok[p]
                RC[s, r] += cost[p]
    cpos = np.empty(P, dtype=np.int64)
    for x in range(by_cost.shape[0]):
        cpos[by_cost[x]] = x
    nc = by_cost.shape[0]
    left = 0
    rt = np.zeros(dp)
    rc = np.zeros(dp)
    for s in range(S):
        if not active[s]:
            continue
        for _ in range(max_rounds):
            allow_s = tt * RT[s].mean()
            e_s = _excess(RT[s], allow_s)
            if e_s <= 0.0:
                break
            ratio_s = max(_ratio(RC[s]), cost_cap)
            best_gain = 0.0
            best_o = -1
            best_q = -1
            for side in range(2):
                r1 = np.argmax(RT[s]) if side == 0 else np.argmin(RT[s])
                for m1 in range(mb):
                    o = grid[s, r1, m1]
                    c0 = max(cpos[o] - window // 2, 0)
                    c1 = min(c0 + window, nc)
                    for x in range(c0, c1):
                        q = by_cost[x]
                        t = step_of[q]
                        if t == s:
                            continue
                        dt = tok[q] - tok[o]
                        dc = cost[q] - cost[o]
                        if (dt > 0) == (side == 0) and dt != 0:
                            continue  # the heaviest rank only gets lighter, the lightest only heavier
                        rt[:] = RT[s]
                        rt[r1] += dt
                        e_s2 = _excess(rt, tt * rt.mean())
                        if e_s2 >= e_s:
                            continue
                        rc[:] = RC[s]
                        rc[r1] += dc
                        if _ratio(rc) > ratio_s:
                            continue
                        r2 = slot_of[q] // mb
                        e_t = _excess(RT[t], tt * RT[t].mean())
                        rt[:] = RT[t]
                        rt[r2] -= dt
                        e_t2 = _excess(rt, tt * rt.mean())
                        if e_t2 > e_t:
                            continue
                        gain = (e_s - e_s2) + (e_t - e_t2)
                        if gain <= best_gain:
                            continue
                        rc[:] = RC[t]
                        rc[r2] -= dc
                        if _ratio(rc) > max(_ratio(RC[t]), cost_cap):
                            continue
                        best_gain = gain
                        best_o = o
                        best_q = q
            if best_o < 0:
                break
            o = best_o
            q = best_q
            t = step_of[q]
            so = slot_of[o]
            sq = slot_of[q]
            grid[s, so // mb, so % mb] = q
            grid[t, sq // mb, sq % mb] = o
            RT[s, so // mb] += tok[q] - tok[o]
            RC[s, so // mb] += cost[q] - cost[o]
            RT[t, sq // mb] += tok[o] - tok[q]
            RC[t, sq // mb] += cost[o] - cost[q]
            step_of[o] = t
            step_of[q] = s
            slot_of[o] = sq
            slot_of[q] = so
        if _excess(RT[s], tt * RT[s].mean()) > 0.0:
            left += 1
    return left
