"""numba kernels of the band schedule (lengths in pad units, cost = units**2): :func:`smooth_loads`,
:func:`assign_bands`. Both run in time linear in the number of samples / packs (times ``dp``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _swap(i, j, units, pack_of, pack_load, mem, pos_of):
    """Exchange samples ``i`` and ``j`` between their packs (member lists and loads follow)."""
    p = pack_of[i]
    q = pack_of[j]
    d = units[j] - units[i]
    pack_load[p] += d
    pack_load[q] -= d
    pack_of[i] = q
    pack_of[j] = p
    a = pos_of[i]
    b = pos_of[j]
    mem[a] = j
    mem[b] = i
    pos_of[i] = b
    pos_of[j] = a


@njit(cache=True)
def _accepts(q, change, pack_load, lo, hi, cap):
    """Pack ``q`` may change its load by ``change`` units: it stays <= ``cap`` and does not leave its band
    ``[lo[q], hi[q]]`` (or move further out of it)."""
    nq = pack_load[q] + change
    return nq <= cap and nq >= min(lo[q], pack_load[q]) and nq <= max(hi[q], pack_load[q])


@njit(cache=True)
def _direct(p, excl, sign, d, units, pack_of, pack_load, mstart, mem, lo, hi, srt, vstart, cap, kmax):
    """A sample ``i`` of pack ``p`` and a sample ``j`` exactly ``d`` units longer (``sign`` +1) or shorter (-1)
    in another pack ``q`` (not ``excl``) that accepts the opposite change. Returns ``(i, j)``, or
    ``(-1, -1)``; ``kmax`` candidates per length are tried from a random offset."""
    m0 = mstart[p]
    m1 = mstart[p + 1]
    off = np.random.randint(0, max(m1 - m0, 1))
    for y in range(m1 - m0):
        i = mem[m0 + (off + y) % (m1 - m0)]
        lj = units[i] + sign * d
        if lj < 1 or lj > cap:
            continue
        lo_j = vstart[lj]
        cnt = vstart[lj + 1] - lo_j
        if cnt == 0:
            continue
        o2 = np.random.randint(0, cnt)
        for c in range(min(cnt, kmax)):
            j = srt[lo_j + (o2 + c) % cnt]
            q = pack_of[j]
            if q == p or q == excl:
                continue
            if _accepts(q, -sign * d, pack_load, lo, hi, cap):
                return i, j
    return -1, -1


@njit(cache=True)
def _two_hop(p, sign, dmax, units, pack_of, pack_load, mstart, mem, pos_of, lo, hi, srt, vstart, cap, kmax, budget,
             left):
    """Pack ``p`` changes by ``sign * d`` (``d`` from ``dmax`` down) through a middle pack ``q``: ``p`` swaps a
    sample with one ``d`` units longer/shorter held by ``q`` (any pack, even a full one), and ``q`` gets its
    load back by a second length-matched swap with a pack ``r`` (not ``p``) that accepts the change. Tries at
    most ``budget`` first swaps (each undone when no second one is found), and at most ``left[0]`` in all
    (decremented: the caller's total). Returns True when done."""
    tries = 0
    m0 = mstart[p]
    m1 = mstart[p + 1]
    for d in range(dmax, 0, -1):
        for y in range(m1 - m0):
            i = mem[m0 + y]
            lj = units[i] + sign * d
            if lj < 1 or lj > cap:
                continue
            lo_j = vstart[lj]
            cnt = vstart[lj + 1] - lo_j
            if cnt == 0:
                continue
            o2 = np.random.randint(0, cnt)
            for c in range(cnt):
                j = srt[lo_j + (o2 + c) % cnt]
                q = pack_of[j]
                if q == p:
                    continue
                tries += 1
                left[0] -= 1
                if tries > budget or left[0] < 0:
                    return False
                _swap(i, j, units, pack_of, pack_load, mem, pos_of)  # p gets j; q gets i
                k, m = _direct(q, p, sign, d, units, pack_of, pack_load, mstart, mem, lo, hi, srt, vstart, cap,
                               kmax)
                if k >= 0:
                    _swap(k, m, units, pack_of, pack_load, mem, pos_of)
                    return True
                _swap(i, j, units, pack_of, pack_load, mem, pos_of)  # undo
    return False


@njit(cache=True)
def smooth_loads(todo, units, pack_of, pack_load, mstart, mem, pos_of, lo, hi, srt, vstart, cap, dlim, kmax, seed,
                 hop_budget):
    """Bring every pack of ``todo`` into its load band ``[lo[p], hi[p]]`` by length-matched swaps.

    A pack below its band exchanges one of its samples for a sample ``d`` units longer (``d`` as large
    as the band allows, at most ``dlim``) held by any pack that does not leave its own band (or move
    further out of it) by giving ``d`` units; a pack above its band, symmetrically. Candidates of one
    length are found through the length index (``srt`` = sample ids by length, ``vstart[L]`` = first
    of length ``L``), ``kmax`` of them tried from a seeded random offset. When no such partner exists
    (the packs with room to give or take are rare), the change goes through a middle pack
    (:func:`_two_hop`, at most ``hop_budget`` first swaps per attempt and 16 x ``hop_budget`` per call; 0 =
    never). Swaps keep every pack's
    sample count; ``mem[mstart[p]:mstart[p+1]]`` stays the member list of pack ``p``. Work: O(samples of
    ``todo`` x band width x ``kmax``), plus 16 x ``hop_budget`` x ``kmax`` x pack size for the
    two-hop attempts. Returns the number of packs of ``todo`` still outside their band."""
    np.random.seed(seed)
    left = 0
    hops_left = np.full(1, 16 * hop_budget, dtype=np.int64)
    for x in range(todo.shape[0]):
        p = todo[x]
        for _ in range(4 * (mstart[p + 1] - mstart[p]) + 8):
            load = pack_load[p]
            if lo[p] <= load <= hi[p]:
                break
            sign = 1 if load < lo[p] else -1  # +1: p gains units, -1: p loses units
            dmax = (hi[p] - load) if sign > 0 else (load - lo[p])
            dmax = min(dmax, dlim)
            done = False
            for d in range(dmax, 0, -1):
                i, j = _direct(p, -1, sign, d, units, pack_of, pack_load, mstart, mem, lo, hi, srt, vstart, cap,
                               kmax)
                if i >= 0:
                    _swap(i, j, units, pack_of, pack_load, mem, pos_of)
                    done = True
                    break
            if not done and hop_budget > 0:
                done = _two_hop(p, sign, dmax, units, pack_of, pack_load, mstart, mem, pos_of, lo, hi, srt, vstart,
                                cap, kmax, hop_budget, hops_left)
            if not done:
                break
        if not (lo[p] <= pack_load[p] <= hi[p]):
            left += 1
    return left


@njit(cache=True)
def assign_bands(order, tokens, cost, dp, shape, grids):
    """Cut ``order`` (pack ids) into consecutive steps of ``dp * shape[s]`` packs and deal each step's
    packs, in decreasing cost, to the rank with room (``shape[s]`` packs, at most one filler per rank)
    that minimises the larger of its normalised token and cost loads: vector LPT (Graham 1969) with a
    cardinality cap. ``grids``: int64 [sum(dp * shape)] output, step after step, rank-major; -1 = filler."""
    pos = 0
    out = 0
    p = order.shape[0]
    for s in range(shape.shape[0]):
        m = shape[s]
        take = min(dp * m, p - pos)
        members = order[pos:pos + take]
        members = members[np.argsort(-cost[members], kind="mergesort")]
        pos += take
        t_load = np.zeros(dp)
        c_load = np.zeros(dp)
        counts = np.zeros(dp, dtype=np.int64)
        t_ref = 0.0
        c_ref = 0.0
        for x in range(take):
            t_ref += tokens[members[x]]
            c_ref += cost[members[x]]
        t_ref = max(t_ref / dp, 1.0)
        c_ref = max(c_ref / dp, 1e-12)
        base = take // dp
        n_big = take - base * dp
        for x in range(dp * m):
            grids[out + x] = -1
        for x in range(take):
            i = members[x]
            big = 0
            for r in range(dp):
                if counts[r] > base:
                    big += 1
            limit = base + 1 if big < n_big else base
            best = -1
            bs = 1e300
            for r in range(dp):
                if counts[r] >= limit:
                    continue
                sc = max((t_load[r] + tokens[i]) / t_ref, (c_load[r] + cost[i]) / c_ref)
                if sc < bs:
                    bs = sc
                    best = r
            grids[out + best * m + counts[best]] = i
            counts[best] += 1
            t_load[best] += tokens[i]
            c_load[best] += cost[i]
        out += dp * m


@njit(cache=True)
def step_bands(flat, sizes, load, rigid, delta, cap, lo, hi):
    """For each step (``sizes[s]`` slots of ``flat``, -1 = filler), the load window ``[a, a + delta]``
    (``a + delta <= cap``) holding most of its ``rigid`` packs, then most of its packs (ties: the higher
    window); writes it to ``lo``/``hi`` of the step's packs. Returns the number of packs outside."""
    out = 0
    pos = 0
    for s in range(sizes.shape[0]):
        k = sizes[s]
        best_a = cap - delta
        best_n = -1
        for x in range(pos, pos + k):
            if flat[x] < 0:
                continue
            a = min(load[flat[x]], cap - delta)
            m = 0
            for y in range(pos, pos + k):
                if flat[y] >= 0 and a <= load[flat[y]] <= a + delta:
                    m += 1 + (k + 1) * rigid[flat[y]]
            if m > best_n or (m == best_n and a > best_a):
                best_n = m
                best_a = a
        for x in range(pos, pos + k):
            if flat[x] >= 0:
                lo[flat[x]] = best_a
                hi[flat[x]] = best_a + delta
                if not (best_a <= load[flat[x]] <= best_a + delta):
                    out += 1
        pos += k
    return out


@njit(cache=True)
def spread_rigid(order, rigid, load, cost, sizes, delta, rel):
    """In place on ``order`` (pack ids, cut into steps of ``sizes``): a ``rigid`` pack whose load is more
    than ``delta`` from a rigid pack already in its step trades places with the next non-rigid pack of
    a later step whose cost is within ``rel`` (relative) of its own, so a step's rigid packs share one
    load window while the steps' cost balance barely moves."""
    p = order.shape[0]
    start = np.zeros(p, dtype=np.int64)  # first position of the step holding each position
    pos = 0
    for s in range(sizes.shape[0]):
        for x in range(pos, min(pos + sizes[s], p)):
            start[x] = pos
        pos += sizes[s]
    nxt = 0
    for x in range(p):
        i = order[x]
        if not rigid[i]:
            continue
        clash = False
        for y in range(start[x], x):
            j = order[y]
            if rigid[j] and abs(load[j] - load[i]) > delta:
                clash = True
                break
        if not clash:
            continue
        nxt = max(nxt, x + 1)
        while nxt < p and (rigid[order[nxt]] or start[nxt] == start[x]):
            nxt += 1
        if nxt >= p or abs(cost[order[nxt]] - cost[i]) > rel * cost[i]:
            continue
        order[x] = order[nxt]
        order[nxt] = i
