"""numba kernels of the sample-level local search (lengths in pad units, cost = units**2).

Entry points: :func:`level_all`, :func:`repair_cross`, :func:`pour_sand`, :func:`lpt_fixed`.

A step's key is lexicographic: (max(tp, 0.9), max(cp, stop), max(tp, stop), g) with
tp = token spread / tt, cp = (cost max/mean - 1) / ct and g = summed squared scaled deviations
(tie-break). Tokens come first until they are within 0.9 x target, because an even token count is
usually within reach of sample moves while the cost goal can be unreachable (see
cost_ratio_lower_bound); then cost is lowered without pushing tokens off target again.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_TOKEN_GUARD = 0.9  # token part (spread / tolerance) below which cost takes priority


@njit(cache=True)
def _row_score(rt, rc, tt, ct):
    """(tp, cp, g) of one step from its per-rank tokens ``rt`` and costs ``rc``."""
    dp = rt.shape[0]
    st = 0.0
    sc = 0.0
    tmax = -1e300
    tmin = 1e300
    cmax = -1e300
    for r in range(dp):
        st += rt[r]
        sc += rc[r]
        if rt[r] > tmax:
            tmax = rt[r]
        if rt[r] < tmin:
            tmin = rt[r]
        if rc[r] > cmax:
            cmax = rc[r]
    mt = st / dp
    mc = sc / dp
    tp = 0.0
    cp = 0.0
    g = 0.0
    if mt > 0:
        tp = (tmax - tmin) / mt / tt
        for r in range(dp):
            d = (rt[r] - mt) / (mt * tt)
            g += d * d
    if mc > 0:
        cp = (cmax / mc - 1.0) / ct
        for r in range(dp):
            d = (rc[r] - mc) / (mc * ct)
            g += 0.25 * d * d
    return tp, cp, g


@njit(cache=True)
def _cmp(x1, x0):
    """-1 / 0 / 1: ``x1`` below / within 1e-12 of / above ``x0``."""
    if x1 < x0 - 1e-12:
        return -1
    if x1 > x0 + 1e-12:
        return 1
    return 0


@njit(cache=True)
def _better(tp1, cp1, g1, tp0, cp0, g0, stop):
    """Lexicographic: tokens down to 0.9 x target, then cost down to ``stop``, then tokens down to
    ``stop``, then the tie-break ``g``."""
    c = _cmp(max(tp1, _TOKEN_GUARD), max(tp0, _TOKEN_GUARD))
    if c == 0:
        c = _cmp(max(cp1, stop), max(cp0, stop))
    if c == 0:
        c = _cmp(max(tp1, stop), max(tp0, stop))
    if c == 0:
        return g1 < g0 - 1e-12
    return c < 0


@njit(cache=True)
def _score_with(rt, rc, a, da, dca, b, db, dcb, tt, ct):
    rt[a] += da
    rc[a] += dca
    rt[b] += db
    rc[b] += dcb
    tp, cp, g = _row_score(rt, rc, tt, ct)
    rt[a] -= da
    rc[a] -= dca
    rt[b] -= db
    rc[b] -= dcb
    return tp, cp, g


@njit(cache=True)
def _pair_swap(mem, units, cs, pack_of, pack_rank, pack_load, rt, rc, cap, tt, ct, stop, tp0, cp0, g0):
    """Best improving 1-for-2 exchange (one sample of rank a for two of rank b, both ways) between the
    extreme ranks (highest vs lowest cost, highest vs lowest tokens). Moves tokens-neutral cost where
    single swaps cannot (e.g. full packs of short vs. long chat turns). Applies it; returns
    (applied, tp, cp, g)."""
    dp = rt.shape[0]
    n = mem.shape[0]
    ca = 0
    cb = 0
    ta = 0
    tb = 0
    for r in range(dp):
        if rc[r] > rc[ca]:
            ca = r
        if rc[r] < rc[cb]:
            cb = r
        if rt[r] > rt[ta]:
            ta = r
        if rt[r] < rt[tb]:
            tb = r
    btp = tp0
    bcp = cp0
    bg = g0
    bi = -1
    bj1 = -1
    bj2 = -1
    in_a = np.empty(n, dtype=np.int64)
    in_b = np.empty(n, dtype=np.int64)
    for pr in range(4):
        if pr == 0:
            a, b = ca, cb
        elif pr == 1:
            a, b = cb, ca
        elif pr == 2:
            a, b = ta, tb
        else:
            a, b = tb, ta
        if a == b:
            continue
        na = 0
        nb = 0
        for x in range(n):
            r = pack_rank[pack_of[mem[x]]]
            if r == a:
                in_a[na] = mem[x]
                na += 1
            elif r == b:
                in_b[nb] = mem[x]
                nb += 1
        for x in range(na):  # i in rank a <-> (j1, j2) in rank b
            i = in_a[x]
            p = pack_of[i]
            li = units[i]
            for y1 in range(nb):
                j1 = in_b[y1]
                q1 = pack_of[j1]
                for y2 in range(y1 + 1, nb):
                    j2 = in_b[y2]
                    q2 = pack_of[j2]
                    lj = units[j1] + units[j2]
                    if pack_load[p] - li + lj > cap:
                        continue
                    if q1 == q2:
                        if pack_load[q1] - lj + li > cap:
                            continue
                    elif pack_load[q1] - units[j1] + li > cap:
                        continue
                    d = lj - li
                    dc = cs[j1] + cs[j2] - cs[i]
                    tp, cp, g = _score_with(rt, rc, a, d, dc, b, -d, -dc, tt, ct)
                    if _better(tp, cp, g, btp, bcp, bg, stop):
                        btp = tp
                        bcp = cp
                        bg = g
                        bi = i
                        bj1 = j1
                        bj2 = j2
    if bi < 0:
        return False, tp0, cp0, g0
    p = pack_of[bi]
    q1 = pack_of[bj1]
    q2 = pack_of[bj2]
    a = pack_rank[p]
    b = pack_rank[q1]
    d = units[bj1] + units[bj2] - units[bi]
    dc = cs[bj1] + cs[bj2] - cs[bi]
    pack_load[p] += d
    pack_load[q1] += units[bi] - units[bj1]
    pack_load[q2] -= units[bj2]
    pack_of[bi] = q1
    pack_of[bj1] = p
    pack_of[bj2] = p
    rt[a] += d
    rc[a] += dc
    rt[b] -= d
    rc[b] -= dc
    return True, btp, bcp, bg


@njit(cache=True)
def _level_step(mem, pids, units, cs, pack_of, pack_rank, pack_load, rt, rc, cap, tt, ct, stop, max_iter):
    """Best-improvement moves/swaps of samples between the ranks of one step (in place).

    Returns the final (tp, cp)."""
    n = mem.shape[0]
    tp0, cp0, g0 = _row_score(rt, rc, tt, ct)
    idle = 0
    for _ in range(max_iter):
        if tp0 <= stop and cp0 <= stop:
            break
        btp = tp0
        bcp = cp0
        bg = g0
        kind = 0
        bi = -1
        bj = -1
        for x in range(n):
            i = mem[x]
            p = pack_of[i]
            a = pack_rank[p]
            li = units[i]
            ci = cs[i]
            for y in range(pids.shape[0]):  # move i into pack q of another rank
                q = pids[y]
                b = pack_rank[q]
                if b == a or pack_load[q] + li > cap:
                    continue
                tp, cp, g = _score_with(rt, rc, a, -li, -ci, b, li, ci, tt, ct)
                if _better(tp, cp, g, btp, bcp, bg, stop):
                    btp = tp
                    bcp = cp
                    bg = g
                    kind = 1
                    bi = i
                    bj = q
            for y in range(x + 1, n):  # swap i and j across ranks
                j = mem[y]
                q = pack_of[j]
                b = pack_rank[q]
                lj = units[j]
                if b == a or lj == li:
                    continue
                if pack_load[p] - li + lj > cap or pack_load[q] - lj + li > cap:
                    continue
                d = lj - li
                dc = cs[j] - ci
                tp, cp, g = _score_with(rt, rc, a, d, dc, b, -d, -dc, tt, ct)
                if _better(tp, cp, g, btp, bcp, bg, stop):
                    btp = tp
                    bcp = cp
                    bg = g
                    kind = 2
                    bi = i
                    bj = j
        if kind == 0:
            ok, tp0, cp0, g0 = _pair_swap(mem, units, cs, pack_of, pack_rank, pack_load, rt, rc, cap, tt, ct, stop,
                                          tp0, cp0, g0)
            if not ok:
                break
            continue
        i = bi
        p = pack_of[i]
        a = pack_rank[p]
        if kind == 1:
            q = bj
            b = pack_rank[q]
            pack_load[p] -= units[i]
            pack_load[q] += units[i]
            rt[a] -= units[i]
            rt[b] += units[i]
            rc[a] -= cs[i]
            rc[b] += cs[i]
            pack_of[i] = q
        else:
            j = bj
            q = pack_of[j]
            b = pack_rank[q]
            d = units[j] - units[i]
            dc = cs[j] - cs[i]
            pack_load[p] += d
            pack_load[q] -= d
            rt[a] += d
            rt[b] -= d
            rc[a] += dc
            rc[b] -= dc
            pack_of[i] = q
            pack_of[j] = p
        if _better(btp, bcp, 0.0, tp0, cp0, 0.0, stop):  # better on the key without the tie-break
            idle = 0
        else:
            idle += 1  # only the tie-break improved
            if idle > 20:
                tp0 = btp
                cp0 = bcp
                break
        tp0 = btp
        cp0 = bcp
        g0 = bg
    return tp0, cp0


@njit(cache=True)
def level_all(members, mstart, pack_ids, pstart, units, cs, pack_of, pack_rank, pack_load, RT, RC, cap, tt, ct,
               stop, max_iter, active):
    for s in range(mstart.shape[0] - 1):  # budget grows with the step's sample count (empty packs to fill)
        if not active[s]:
            continue
        _level_step(members[mstart[s]:mstart[s + 1]], pack_ids[pstart[s]:pstart[s + 1]], units, cs, pack_of,
                    pack_rank, pack_load, RT[s], RC[s], cap, tt, ct, stop,
                    max_iter + min(2 * (mstart[s + 1] - mstart[s]), 200))


@njit(cache=True)
def _prio(tp, cp, stop):
    """Worst-step priority: tokens above 0.9 x target first, then cost, then tokens."""
    return max(tp, _TOKEN_GUARD) * 1e8 + min(max(cp, stop), 9999.0) * 1e4 + min(max(tp, stop), 9999.0)


@njit(cache=True)
def repair_cross(members, mstart, pos_of, pack_ids, pstart, units, cs, pack_of, pack_rank, pack_step, pack_load,
                  RT, RC, full, srt, vstart, cap, tt, ct, stop, budget, max_iter, seed, active):
    """Min-max repair across steps: the worst full ``active`` step swaps a sample with a near-equal-length
    sample of another full step; the partner is re-leveled if needed and must end with token and cost parts
    <= max(old, 0.9) (else the swap is undone); then the worst step is re-leveled inside."""
    S = mstart.shape[0] - 1
    dp = RT.shape[1]
    TP = np.zeros(S)
    CP = np.zeros(S)
    for s in range(S):
        TP[s], CP[s], _ = _row_score(RT[s], RC[s], tt, ct)
    stuck = np.zeros(S, dtype=np.bool_)
    np.random.seed(seed)
    kmax = 8  # candidates tried per (sample, length)
    ncand = 6  # best swaps tried per repair (partner re-level may reject)
    c_i = np.empty(ncand, dtype=np.int64)
    c_j = np.empty(ncand, dtype=np.int64)
    c_k = np.empty(ncand)
    plim = 0.9
    for _ in range(budget):
        s = -1
        best = -1.0
        for k in range(S):
            if full[k] and active[k] and not stuck[k] and (TP[k] > stop or CP[k] > stop):
                v = _prio(TP[k], CP[k], stop)
                if v > best:
                    best = v
                    s = k
        if s < 0:
            break
        rt = RT[s]
        rc = RC[s]
        tsum = 0.0
        tmax = -1e300
        tmin = 1e300
        for r in range(dp):
            tsum += rt[r]
            tmax = max(tmax, rt[r])
            tmin = min(tmin, rt[r])
        tol = int(np.ceil(tt * tsum / dp)) + 1
        dlim = min(max(int(tmax - tmin), tol), 64)
        _, _, g_s = _row_score(rt, rc, tt, ct)
        cur = _prio(TP[s], CP[s], stop)
        nc = 0
        for x in range(mstart[s], mstart[s + 1]):
            i = members[x]
            p = pack_of[i]
            a = pack_rank[p]
            li = units[i]
            for d in range(-dlim, dlim + 1):
                if d == 0:
                    continue
                lj = li + d
                if lj < 1 or lj > cap or pack_load[p] + d > cap:
                    continue
                lo = vstart[lj]
                cnt = vstart[lj + 1] - lo
                if cnt == 0:
                    continue
                off = np.random.randint(0, cnt)
                for c in range(min(cnt, kmax)):
                    j = srt[lo + (off + c) % cnt]
                    q = pack_of[j]
                    t = pack_step[q]
                    if t == s or not full[t] or pack_load[q] - d > cap:
                        continue
                    dc = cs[j] - cs[i]
                    stp, scp, sg = _score_with(rt, rc, a, d, dc, a, 0.0, 0.0, tt, ct)
                    if not _better(stp, scp, sg, TP[s], CP[s], g_s, stop):
                        continue
                    key = _prio(stp, scp, stop) + 1e-6 * sg
                    b = pack_rank[q]
                    ttp, tcp, _ = _score_with(RT[t], RC[t], b, -d, -dc, b, 0.0, 0.0, tt, ct)
                    if ttp > max(TP[t], plim) + 1e-12 or tcp > max(CP[t], plim) + 1e-12:
                        key += 1e12  # partner would need re-leveling: try after the direct swaps
                    # keep the ncand best keys (insertion)
                    if nc < ncand:
                        pos = nc
                        nc += 1
                    elif key < c_k[nc - 1]:
                        pos = nc - 1
                    else:
                        continue
                    while pos > 0 and c_k[pos - 1] > key:
                        c_k[pos] = c_k[pos - 1]
                        c_i[pos] = c_i[pos - 1]
                        c_j[pos] = c_j[pos - 1]
                        pos -= 1
                    c_k[pos] = key
                    c_i[pos] = i
                    c_j[pos] = j
        done = False
        for z in range(nc):
            i = c_i[z]
            j = c_j[z]
            p = pack_of[i]
            q = pack_of[j]
            t = pack_step[q]
            a = pack_rank[p]
            b = pack_rank[q]
            d = units[j] - units[i]
            dc = cs[j] - cs[i]
            ttp, tcp, _ = _score_with(RT[t], RC[t], b, -d, -dc, b, 0.0, 0.0, tt, ct)
            lim_t = max(TP[t], plim)
            lim_c = max(CP[t], plim)
            # snapshot the partner step, apply the swap, re-level the partner if it went off limits
            m0 = mstart[t]
            m1 = mstart[t + 1]
            snap_pack = pack_of[members[m0:m1]].copy()
            snap_load = pack_load[pack_ids[pstart[t]:pstart[t + 1]]].copy()
            snap_rt = RT[t].copy()
            snap_rc = RC[t].copy()
            pack_load[p] += d
            pack_load[q] -= d
            RT[s, a] += d
            RC[s, a] += dc
            RT[t, b] -= d
            RC[t, b] -= dc
            pack_of[i] = q
            pack_of[j] = p
            pi = pos_of[i]
            pj = pos_of[j]
            members[pi] = j
            members[pj] = i
            pos_of[i] = pj
            pos_of[j] = pi
            if ttp > lim_t + 1e-12 or tcp > lim_c + 1e-12:
                ttp, tcp = _level_step(members[m0:m1], pack_ids[pstart[t]:pstart[t + 1]], units, cs, pack_of,
                                       pack_rank, pack_load, RT[t], RC[t], cap, tt, ct, min(stop, plim),
                                       max_iter)
            if ttp <= lim_t + 1e-12 and tcp <= lim_c + 1e-12:
                TP[t] = ttp
                CP[t] = tcp
                stuck[t] = False
                TP[s], CP[s] = _level_step(members[mstart[s]:mstart[s + 1]], pack_ids[pstart[s]:pstart[s + 1]],
                                           units, cs, pack_of, pack_rank, pack_load, RT[s], RC[s], cap, tt, ct,
                                           stop, max_iter)
                done = True
                break
            # undo: swap back, restore the partner's snapshot
            members[pi] = i
            members[pj] = j
            pos_of[i] = pi
            pos_of[j] = pj
            pack_of[i] = p
            pack_load[p] -= d
            RT[s, a] -= d
            RC[s, a] -= dc
            for w in range(m1 - m0):
                pack_of[members[m0 + w]] = snap_pack[w]
            pk = pack_ids[pstart[t]:pstart[t + 1]]
            for w in range(pk.shape[0]):
                pack_load[pk[w]] = snap_load[w]
            for r in range(dp):
                RT[t, r] = snap_rt[r]
                RC[t, r] = snap_rc[r]
        if not done or _prio(TP[s], CP[s], stop) >= cur:
            if not done:
                stuck[s] = True


@njit(cache=True)
def pour_sand(sand, units, pack_of, pack_load, bin_packs, mb_of_bin, bin_step, load, step_max, cap):
    """Pour ``sand`` (descending lengths) into rank-bins: the bin furthest below its step's most loaded
    rank first (then the least loaded bin), into that bin's roomiest pack. Returns False if one fits nowhere."""
    nb = load.shape[0]
    for x in range(sand.shape[0]):
        i = sand[x]
        li = units[i]
        best = -1
        bdef = -1e300
        bload = 1e300
        for k in range(nb):
            room = 0
            for m in range(mb_of_bin[k]):
                rr = cap - pack_load[bin_packs[k, m]]
                if rr > room:
                    room = rr
            if room < li:
                continue
            d = step_max[bin_step[k]] - load[k]
            if d > bdef + 1e-9 or (abs(d - bdef) <= 1e-9 and load[k] < bload):
                bdef = d
                bload = load[k]
                best = k
        if best < 0:
            return False
        if bdef <= 0:  # all level: lowest bin overall
            for k in range(nb):
                room = 0
                for m in range(mb_of_bin[k]):
                    rr = cap - pack_load[bin_packs[k, m]]
                    if rr > room:
                        room = rr
                if room >= li and load[k] < load[best]:
                    best = k
        q = -1
        room = -1
        for m in range(mb_of_bin[best]):
            rr = cap - pack_load[bin_packs[best, m]]
            if rr > room:
                room = rr
                q = bin_packs[best, m]
        pack_of[i] = q
        pack_load[q] += li
        load[best] += li
        if load[best] > step_max[bin_step[best]]:
            step_max[bin_step[best]] = load[best]
    return True


@njit(cache=True)
def lpt_fixed(order, units, nbins, cap, bin_of):
    """Re-pack ``order`` (descending lengths) into exactly ``nbins`` bins with even loads.

    Samples longer than the mean load ("rigid") open a bin each and are topped up toward ``cap`` by
    best fit (their bins cannot come down to the mean, so they are made equal to each other at the
    cap instead); every other sample then goes to the least loaded remaining bin (Graham's LPT).
    Returns False if a sample fits nowhere."""
    n = order.shape[0]
    load = np.zeros(nbins, dtype=np.int64)
    total = 0
    for x in range(n):
        total += units[order[x]]
    mean = total / max(nbins, 1)
    nr = 0
    while nr < n and nr < nbins - 1 and units[order[nr]] > mean:
        bin_of[order[nr]] = nr
        load[nr] = units[order[nr]]
        nr += 1
    placed = np.zeros(n, dtype=np.bool_)
    placed[:nr] = True
    if nr > 0:
        for x in range(nr, n):  # best fit into the rigid bins
            i = order[x]
            b = -1
            for k in range(nr):
                room = cap - load[k]
                if room >= units[i] and (b < 0 or room < cap - load[b]):
                    b = k
            if b >= 0:
                bin_of[i] = b
                load[b] += units[i]
                placed[x] = True
    for x in range(n):
        if placed[x]:
            continue
        i = order[x]
        b = nr
        for k in range(nr + 1, nbins):
            if load[k] < load[b]:
                b = k
        if b >= nbins or load[b] + units[i] > cap:
            return False
        bin_of[i] = b
        load[b] += units[i]
    return True
