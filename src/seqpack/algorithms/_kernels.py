"""numba kernels behind :mod:`seqpack.algorithms.core` (private).

All kernels work on integer item sizes in *units* (padded length / pad multiple) and an integer
capacity ``cap`` in the same units, and return ``bin_of`` (int64[n], the bin id of each item, bins
numbered 0..nb-1 in opening order) plus the bin count. Compiled with ``cache=True`` so the JIT cost is
paid once per machine.

Two search structures make every kernel O(n log cap) or O(n log n) for ANY capacity (case B13: no
power-of-two assumption; trees are sized to the next power of two and padded with empty leaves):

* a *value tree*: a bit tree over the values 0..cap marking which values are non-empty, with
  ``_find_ge`` (smallest non-empty value >= s) and ``_find_le`` (largest non-empty value <= r);
  paired with per-value LIFO stacks (``head``/``nxt`` linked lists) of bins or items;
* a *bin tree*: a max tree over bin indices holding remaining capacity, with ``_ff_query``
  (leftmost bin with remaining >= s), which is first fit in O(log n).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros


# --------------------------------------------------------------------------------------------
# ordering helpers
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def desc_order(sizes, cap):
    """Indices sorted by size descending, ties by index ascending (stable counting sort, O(n+cap))."""
    n = sizes.shape[0]
    cnt = np.zeros(cap + 2, np.int64)
    for i in range(n):
        cnt[cap - sizes[i] + 1] += 1
    for v in range(1, cap + 2):
        cnt[v] += cnt[v - 1]
    out = np.empty(n, np.int64)
    for i in range(n):
        k = cap - sizes[i]
        out[cnt[k]] = i
        cnt[k] += 1
    return out


@njit(cache=True)
def csr_by_bin(bin_of, nb):
    """(offsets int64[nb+1], items int64[n]): items of bin b are items[offsets[b]:offsets[b+1]],
    in ascending item index (stable counting sort by bin id)."""
    n = bin_of.shape[0]
    off = np.zeros(nb + 1, np.int64)
    for i in range(n):
        off[bin_of[i] + 1] += 1
    for b in range(nb):
        off[b + 1] += off[b]
    pos = off[:-1].copy()
    items = np.empty(n, np.int64)
    for i in range(n):
        b = bin_of[i]
        items[pos[b]] = i
        pos[b] += 1
    return off, items


@njit(cache=True)
def loads_of(sizes, bin_of, nb):
    loads = np.zeros(nb, np.int64)
    for i in range(sizes.shape[0]):
        loads[bin_of[i]] += sizes[i]
    return loads


# --------------------------------------------------------------------------------------------
# value tree (bit tree over 0..cap)
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def _pow2(x):
    p = 1
    while p < x:
        p *= 2
    return p


@njit(cache=True)
def _vt_set(tree, P, v, flag):
    """Set value ``v``'s flag (0/1) and OR it up the path.

    Kept apart from the bin tree's ``_ff_update`` (max instead of OR) and written out at every
    stack push/pop on purpose: one max-update for both trees measured ~15 % slower on best fit
    (100k lognormal lengths), and ``_push``/``_pop`` helpers taking the three arrays made the
    kernels 2-7x slower, with or without ``inline="always"`` (numba 0.68; a push helper alone
    took 3 ms against 0.1 ms inline for 100k items)."""
    i = v + P
    tree[i] = flag
    i //= 2
    while i >= 1:
        f = tree[2 * i] | tree[2 * i + 1]
        if tree[i] == f:
            break
        tree[i] = f
        i //= 2


@njit(cache=True)
def _find_ge(tree, P, s):
    """Smallest non-empty value >= s, or -1."""
    if s >= P:
        return -1
    i = s + P
    if tree[i]:
        return s
    while i > 1:
        if (i & 1) == 0 and tree[i + 1]:
            i = i + 1
            while i < P:
                i = 2 * i if tree[2 * i] else 2 * i + 1
            return i - P
        i //= 2
    return -1


@njit(cache=True)
def _find_le(tree, P, r):
    """Largest non-empty value <= r, or -1."""
    if r < 0:
        return -1
    if r >= P:
        r = P - 1
    i = r + P
    if tree[i]:
        return r
    while i > 1:
        if (i & 1) == 1 and tree[i - 1]:
            i = i - 1
            while i < P:
                i = 2 * i + 1 if tree[2 * i + 1] else 2 * i
            return i - P
        i //= 2
    return -1


# --------------------------------------------------------------------------------------------
# next fit / first fit / best fit
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def next_fit(sizes, order, cap):
    """Concatenative (next fit) in the given order. O(n)."""
    n = order.shape[0]
    bin_of = np.empty(sizes.shape[0], np.int64)
    nb = 0
    load = cap + 1
    for k in range(n):
        i = order[k]
        s = sizes[i]
        if load + s > cap:
            nb += 1
            load = 0
        bin_of[i] = nb - 1
        load += s
    return bin_of, nb


@njit(cache=True)
def _ff_update(tree, P, b, val):
    i = b + P
    tree[i] = val
    i //= 2
    while i >= 1:
        m = tree[2 * i]
        if tree[2 * i + 1] > m:
            m = tree[2 * i + 1]
        if tree[i] == m:
            break
        tree[i] = m
        i //= 2


@njit(cache=True)
def _ff_query(tree, P, s):
    """Leftmost leaf with value >= s (caller guarantees tree[1] >= s)."""
    i = 1
    while i < P:
        i = 2 * i if tree[2 * i] >= s else 2 * i + 1
    return i - P


@njit(cache=True)
def first_fit(sizes, order, cap, init_rem):
    """First fit in the given order over bins in opening order (max tree over bins, O(n log n)).

    ``init_rem`` (int64[k]) pre-opens k bins with those remaining capacities (used by MFFD).
    Returns (bin_of, nb)."""
    n = sizes.shape[0]
    k0 = init_rem.shape[0]
    P = _pow2(order.shape[0] + k0 + 1)
    tree = np.empty(2 * P, np.int64)
    tree[P:] = cap
    for b in range(k0):
        tree[P + b] = init_rem[b]
    for i in range(P - 1, 0, -1):
        tree[i] = max(tree[2 * i], tree[2 * i + 1])
    bin_of = np.full(n, -1, np.int64)
    nb = k0
    for k in range(order.shape[0]):
        i = order[k]
        s = sizes[i]
        b = _ff_query(tree, P, s)
        if b >= nb:
            nb = b + 1
        bin_of[i] = b
        _ff_update(tree, P, b, tree[P + b] - s)
    return bin_of, nb


@njit(cache=True)
def best_fit(sizes, order, cap):
    """Best fit in the given order: each item goes to the bin whose remaining capacity is the
    smallest that still fits; ties go to the bin whose remaining capacity reached that value most
    recently (LIFO bucket). New bin when nothing fits. O(n log cap)."""
    n = sizes.shape[0]
    P = _pow2(cap + 1)
    tree = np.zeros(2 * P, np.uint8)
    head = np.full(cap + 1, -1, np.int64)
    m = order.shape[0]
    nxt = np.empty(m, np.int64)
    rem = np.empty(m, np.int64)
    bin_of = np.full(n, -1, np.int64)
    nb = 0
    for k in range(m):
        i = order[k]
        s = sizes[i]
        v = _find_ge(tree, P, s)
        if v < 0:
            b = nb
            nb += 1
            r = cap - s
        else:
            b = head[v]
            head[v] = nxt[b]
            if head[v] < 0:
                _vt_set(tree, P, v, 0)
            r = v - s
        bin_of[i] = b
        rem[b] = r
        if r > 0:
            if head[r] < 0:
                _vt_set(tree, P, r, 1)
            nxt[b] = head[r]
            head[r] = b
    return bin_of, nb


# --------------------------------------------------------------------------------------------
# greedy knapsack (LLaMA-Factory) and balanced greedy knapsack
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def _item_buckets(sizes, cap):
    """Per-size LIFO stacks of items (pop order = ascending index) + value tree."""
    n = sizes.shape[0]
    P = _pow2(cap + 1)
    tree = np.zeros(2 * P, np.uint8)
    head = np.full(cap + 1, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    for i in range(n - 1, -1, -1):
        s = sizes[i]
        if head[s] < 0:
            _vt_set(tree, P, s, 1)
        nxt[i] = head[s]
        head[s] = i
    return tree, P, head, nxt


@njit(cache=True)
def greedy_knapsack(sizes, cap):
    """One bin at a time: repeatedly add the largest remaining item that still fits; close the
    bin when nothing fits. O(n log cap)."""
    n = sizes.shape[0]
    tree, P, head, nxt = _item_buckets(sizes, cap)
    bin_of = np.full(n, -1, np.int64)
    nb = 0
    placed = 0
    while placed < n:
        r = cap
        while True:
            v = _find_le(tree, P, r)
            if v <= 0:
                break
            i = head[v]
            head[v] = nxt[i]
            if head[v] < 0:
                _vt_set(tree, P, v, 0)
            bin_of[i] = nb
            placed += 1
            r -= v
        nb += 1
    return bin_of, nb


@njit(cache=True)
def _heap_push(hk, hb, size, key, b):
    j = size
    hk[j] = key
    hb[j] = b
    while j > 0:
        p = (j - 1) // 2
        if hk[p] < hk[j] or (hk[p] == hk[j] and hb[p] < hb[j]):
            break
        hk[p], hk[j] = hk[j], hk[p]
        hb[p], hb[j] = hb[j], hb[p]
        j = p
    return size + 1


@njit(cache=True)
def _heap_sift_down(hk, hb, size, j):
    while True:
        l = 2 * j + 1
        if l >= size:
            break
        c = l
        r = l + 1
        if r < size and (hk[r] < hk[l] or (hk[r] == hk[l] and hb[r] < hb[l])):
            c = r
        if hk[j] < hk[c] or (hk[j] == hk[c] and hb[j] < hb[c]):
            break
        hk[c], hk[j] = hk[j], hk[c]
        hb[c], hb[j] = hb[j], hb[c]
        j = c


@njit(cache=True)
def balanced_greedy(sizes, order, cap, k0):
    """Worst fit (LPT) with capacity: k0 bins are opened up front; each item (in ``order``) goes
    to the least-loaded bin (min-heap, ties to the lower bin id) if it fits there, otherwise
    (it then fits nowhere) to a new bin. O(n log k)."""
    n = sizes.shape[0]
    m = order.shape[0]
    hk = np.empty(m + k0 + 1, np.int64)
    hb = np.empty(m + k0 + 1, np.int64)
    size = 0
    for b in range(k0):
        size = _heap_push(hk, hb, size, 0, b)
    nb = k0
    bin_of = np.full(n, -1, np.int64)
    for k in range(m):
        i = order[k]
        s = sizes[i]
        if size > 0 and hk[0] + s <= cap:
            b = hb[0]
            bin_of[i] = b
            hk[0] += s
            _heap_sift_down(hk, hb, size, 0)
        else:
            b = nb
            nb += 1
            bin_of[i] = b
            size = _heap_push(hk, hb, size, s, b)
    return bin_of, nb


# --------------------------------------------------------------------------------------------
# modified first fit decreasing (Johnson & Garey 1985)
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def mffd(sizes, cap):
    """Johnson & Garey's MFFD. Classes: A > cap/2, B in (cap/3, cap/2], C in (cap/6, cap/3],
    rest D. 1) each A item (decreasing) opens its own bin; 2) forward over A-bins: if the
    smallest remaining B fits, add the largest B that fits; 3) backward over A-bins without a B:
    if the two smallest remaining C items fit together, add the smallest C and the largest C
    that fits with it; 4) all remaining items decreasing by first fit over all bins."""
    n = sizes.shape[0]
    order = desc_order(sizes, cap)
    bin_of = np.full(n, -1, np.int64)
    # A items
    na = 0
    for k in range(n):
        if 2 * sizes[order[k]] > cap:
            na += 1
        else:
            break
    rem = np.empty(na, np.int64)
    hasb = np.zeros(na, np.uint8)
    for a in range(na):
        i = order[a]
        bin_of[i] = a
        rem[a] = cap - sizes[i]
    P = _pow2(cap + 1)
    # B multiset
    tb = np.zeros(2 * P, np.uint8)
    hbk = np.full(cap + 1, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    tc = np.zeros(2 * P, np.uint8)
    hck = np.full(cap + 1, -1, np.int64)
    for k in range(n - 1, na - 1, -1):
        i = order[k]
        s = sizes[i]
        if 3 * s > cap:
            if hbk[s] < 0:
                _vt_set(tb, P, s, 1)
            nxt[i] = hbk[s]
            hbk[s] = i
        elif 6 * s > cap:
            if hck[s] < 0:
                _vt_set(tc, P, s, 1)
            nxt[i] = hck[s]
            hck[s] = i
    # step 2
    for a in range(na):
        smallest = _find_ge(tb, P, 1)
        if smallest < 0:
            break
        if smallest > rem[a]:
            continue
        v = _find_le(tb, P, rem[a])
        i = hbk[v]
        hbk[v] = nxt[i]
        if hbk[v] < 0:
            _vt_set(tb, P, v, 0)
        bin_of[i] = a
        rem[a] -= v
        hasb[a] = 1
    # step 3
    for a in range(na - 1, -1, -1):
        if hasb[a]:
            continue
        s1 = _find_ge(tc, P, 1)
        if s1 < 0:
            break
        i1 = hck[s1]
        # second smallest
        if nxt[i1] >= 0:
            s2 = s1
        else:
            s2 = _find_ge(tc, P, s1 + 1)
            if s2 < 0:
                break
        if s1 + s2 > rem[a]:
            continue
        hck[s1] = nxt[i1]
        if hck[s1] < 0:
            _vt_set(tc, P, s1, 0)
        bin_of[i1] = a
        rem[a] -= s1
        v = _find_le(tc, P, rem[a])
        i2 = hck[v]
        hck[v] = nxt[i2]
        if hck[v] < 0:
            _vt_set(tc, P, v, 0)
        bin_of[i2] = a
        rem[a] -= v
    # step 4: remaining items decreasing, first fit over all bins
    m = 0
    for k in range(n):
        if bin_of[order[k]] < 0:
            m += 1
    rest = np.empty(m, np.int64)
    m = 0
    for k in range(n):
        if bin_of[order[k]] < 0:
            rest[m] = order[k]
            m += 1
    b2, nb = first_fit(sizes, rest, cap, rem)
    for k in range(m):
        bin_of[rest[k]] = b2[rest[k]]
    return bin_of, nb


# --------------------------------------------------------------------------------------------
# minimum bin slack (Gupta & Ho 1999), bounded search, for the portfolio
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def _first_le(dval, lo, hi, r):
    """First index in [lo, hi) of the descending array dval with dval[idx] <= r (hi if none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if dval[mid] <= r:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def min_slack(sizes, cap, budget):
    """Minimum Bin Slack (Gupta & Ho 1999), item-oriented variant with a bounded search: each
    pack starts with the largest remaining item, then a depth-first search over the distinct
    remaining sizes (largest first, as many copies as fit, then backtracking) keeps the subset
    with the least slack, stopping at an exact fit or after ``budget`` search steps.
    O(packs * budget * log n) worst case; fast when there are few distinct sizes."""
    n = sizes.shape[0]
    order = desc_order(sizes, cap)
    nd = 0
    for k in range(n):
        if k == 0 or sizes[order[k]] != sizes[order[k - 1]]:
            nd += 1
    dval = np.empty(nd, np.int64)
    ptr = np.empty(nd, np.int64)
    cnt = np.zeros(nd, np.int64)
    j = -1
    for k in range(n):
        if k == 0 or sizes[order[k]] != sizes[order[k - 1]]:
            j += 1
            dval[j] = sizes[order[k]]
            ptr[j] = k
        cnt[j] += 1
    bin_of = np.full(n, -1, np.int64)
    take = np.zeros(nd, np.int64)
    stack_d = np.empty(nd + 1, np.int64)
    best_d = np.empty(nd + 1, np.int64)
    best_t = np.empty(nd + 1, np.int64)
    nb = 0
    first = 0
    remaining = n
    while remaining > 0:
        while cnt[first] == 0:
            first += 1
        i = order[ptr[first]]
        ptr[first] += 1
        cnt[first] -= 1
        bin_of[i] = nb
        remaining -= 1
        r = cap - dval[first]
        best_slack = r
        best_n = 0
        depth = 0
        pos = first
        work = 0
        while True:
            d = _first_le(dval, pos, nd, r)
            while d < nd and r > 0:
                work += 1
                if cnt[d] > 0:
                    t = r // dval[d]
                    if t > cnt[d]:
                        t = cnt[d]
                    take[d] = t
                    r -= t * dval[d]
                    stack_d[depth] = d
                    depth += 1
                    d = _first_le(dval, d + 1, nd, r)
                else:
                    d += 1
            if r < best_slack:
                best_slack = r
                best_n = depth
                for q in range(depth):
                    best_d[q] = stack_d[q]
                    best_t[q] = take[stack_d[q]]
            if best_slack == 0 or work >= budget or depth == 0:
                break
            dd = stack_d[depth - 1]
            take[dd] -= 1
            r += dval[dd]
            if take[dd] == 0:
                depth -= 1
            pos = dd + 1
        for q in range(depth):
            take[stack_d[q]] = 0
        for q in range(best_n):
            dq = best_d[q]
            for _ in range(best_t[q]):
                i = order[ptr[dq]]
                ptr[dq] += 1
                cnt[dq] -= 1
                bin_of[i] = nb
                remaining -= 1
        nb += 1
    return bin_of, nb


# --------------------------------------------------------------------------------------------
# leveling repair ("sand")
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def level(sizes, bin_of, nb, cap, tol):
    """Raise under-full bins by moving small items ("sand") out of fuller bins.

    Floor F = min(max_load - tol, floor(mean load)). Every bin below F receives, largest first,
    items of size <= max_load - F that sit in bins which stay >= F after giving them, without
    rising above max_load; then ``_level_swaps`` handles bins still below F. The bin count and
    max load never change and no bin exceeds cap. Modifies ``bin_of`` in place; returns the
    number of moves + swaps. O(n + moves * log cap)."""
    n = sizes.shape[0]
    if nb <= 1:
        return 0
    loads = loads_of(sizes, bin_of, nb)
    lmax = 0
    total = 0
    for b in range(nb):
        total += loads[b]
        if loads[b] > lmax:
            lmax = loads[b]
    F = lmax - tol
    mean_floor = total // nb
    if mean_floor < F:
        F = mean_floor
    T = lmax - F
    if T <= 0:
        return 0
    if T > cap:
        T = cap
    # receivers
    nrecv = 0
    for b in range(nb):
        if loads[b] < F:
            nrecv += 1
    if nrecv == 0:
        return 0
    P = _pow2(T + 1)
    tree = np.zeros(2 * P, np.uint8)
    head = np.full(T + 1, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    for i in range(n - 1, -1, -1):
        s = sizes[i]
        if s <= T and loads[bin_of[i]] - s >= F:
            if head[s] < 0:
                _vt_set(tree, P, s, 1)
            nxt[i] = head[s]
            head[s] = i
    moved = 0
    for u in range(nb):
        if loads[u] >= F:
            continue
        while loads[u] < F:
            v = _find_le(tree, P, lmax - loads[u])
            if v <= 0:
                break
            i = head[v]
            head[v] = nxt[i]
            if head[v] < 0:
                _vt_set(tree, P, v, 0)
            d = bin_of[i]
            if d == u or loads[d] - v < F:
                continue  # donor can no longer afford it (loads only fall): drop candidate
            bin_of[i] = u
            loads[d] -= v
            loads[u] += v
            moved += 1
    moved += _level_swaps(sizes, bin_of, nb, loads, F, lmax, T, cap)
    return moved


@njit(cache=True)
def _level_swaps(sizes, bin_of, nb, loads, F, lmax, T, cap):
    """Second leveling phase: for a pack u still below F, swap one of its items a with a slightly
    longer item b (a < b <= a + min(T, lmax - load_u)) from a pack that stays >= F. Each swap
    raises u by b - a; chains of swaps (a -> b -> b' ...) let u climb without needing short
    samples. Candidates whose pack cannot afford the swap are skipped (bounded attempts)."""
    n = sizes.shape[0]
    nrecv = 0
    for b in range(nb):
        if loads[b] < F:
            nrecv += 1
    if nrecv == 0:
        return 0
    off, items = csr_by_bin(bin_of, nb)
    P = _pow2(cap + 1)
    tree = np.zeros(2 * P, np.uint8)
    head = np.full(cap + 1, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    for i in range(n - 1, -1, -1):
        if loads[bin_of[i]] > F:
            s = sizes[i]
            if head[s] < 0:
                _vt_set(tree, P, s, 1)
            nxt[i] = head[s]
            head[s] = i
    skipped = np.empty(64, np.int64)
    swaps = 0
    for u in range(nb):
        if loads[u] >= F:
            continue
        mine = items[off[u]:off[u + 1]].copy()
        progress = True
        while loads[u] < F and progress:
            progress = False
            for k in range(mine.shape[0]):
                a = mine[k]
                sa = sizes[a]
                room = lmax - loads[u]
                if room > T:
                    room = T
                if room <= 0:
                    break
                ns = 0
                found = -1
                lim = sa + room
                while ns < 64:
                    v = _find_le(tree, P, lim)
                    if v <= sa:
                        break
                    b = head[v]
                    head[v] = nxt[b]
                    if head[v] < 0:
                        _vt_set(tree, P, v, 0)
                    d = bin_of[b]
                    if d != u and loads[d] - (v - sa) >= F:
                        found = b
                        break
                    if loads[d] > F and d != u:
                        skipped[ns] = b  # may serve a smaller difference later
                        ns += 1
                    # else: pack d can give nothing any more (loads only fall): drop b
                for q in range(ns):
                    bq = skipped[q]
                    sq = sizes[bq]
                    if head[sq] < 0:
                        _vt_set(tree, P, sq, 1)
                    nxt[bq] = head[sq]
                    head[sq] = bq
                if found < 0:
                    continue
                b = found
                d = bin_of[b]
                delta = sizes[b] - sa
                bin_of[b] = u
                bin_of[a] = d
                loads[u] += delta
                loads[d] -= delta
                mine[k] = b
                swaps += 1
                progress = True
                if loads[d] > F:  # a is now a candidate in pack d
                    if head[sa] < 0:
                        _vt_set(tree, P, sa, 1)
                    nxt[a] = head[sa]
                    head[sa] = a
                if loads[u] >= F:
                    break
    return swaps


# --------------------------------------------------------------------------------------------
# bucketed best fit decreasing over size groups (linear: O(n + C))
# --------------------------------------------------------------------------------------------
# A 64-ary bitset over 0..m-1 (one int64 word per 64 values, a summary level per 64 words):
# set / clear / "smallest set value >= v" touch one word per level, ceil(log64(m)) <= 5 levels
# for m <= MAX_CAPACITY_UNITS + 1.
@njit(cache=True)
def _bs_new(m):
    nlev = 1
    w = (m + 63) >> 6
    tot = w
    while w > 1:
        w = (w + 63) >> 6
        tot += w
        nlev += 1
    lo = np.empty(nlev + 1, np.int64)
    w = (m + 63) >> 6
    lo[0] = 0
    for lev in range(nlev):
        lo[lev + 1] = lo[lev] + w
        w = (w + 63) >> 6
    return np.zeros(tot, np.int64), lo


@njit(cache=True)
def _bs_set(bits, lo, v):
    nlev = lo.shape[0] - 1
    for lev in range(nlev):
        w = lo[lev] + (v >> 6)
        old = bits[w]
        bits[w] = old | (np.int64(1) << (v & 63))
        if old != 0:
            return
        v >>= 6


@njit(cache=True)
def _bs_clear(bits, lo, v):
    nlev = lo.shape[0] - 1
    for lev in range(nlev):
        w = lo[lev] + (v >> 6)
        new = bits[w] & ~(np.int64(1) << (v & 63))
        bits[w] = new
        if new != 0:
            return
        v >>= 6


@njit(cache=True)
def _bs_find_ge(bits, lo, v):
    """Smallest set value >= v, or -1."""
    nlev = lo.shape[0] - 1
    lev = 0
    while lev < nlev:
        w = v >> 6
        if lo[lev] + w >= lo[lev + 1]:
            return -1
        word = bits[lo[lev] + w] & (np.int64(-1) << (v & 63))
        if word != 0:
            v = (w << 6) + trailing_zeros(word)
            while lev > 0:
                lev -= 1
                v = (v << 6) + trailing_zeros(bits[lo[lev] + v])
            return v
        v = w + 1
        lev += 1
    return -1


@njit(cache=True)
def size_groups(sizes, cap):
    """(cnt int64[cap+1], start int64[cap+2]): items of size s, and where their slots begin in a
    size-grouped array laid out by size descending (``start[s]``, region ``[start[s], start[s] + cnt[s])``)."""
    cnt = np.zeros(cap + 1, np.int64)
    for i in range(sizes.shape[0]):
        cnt[sizes[i]] += 1
    start = np.zeros(cap + 2, np.int64)
    acc = 0
    for s in range(cap, 0, -1):
        start[s] = acc
        acc += cnt[s]
    start[0] = acc
    start[cap + 1] = 0
    return cnt, start


def grouped_best_fit(cnt, start, cap, n):
    """Best fit decreasing on a size histogram (``_grouped_best_fit_into``, whose docstring has the
    rule); ``slot`` int32 when ``n < 2**31``, the per-pack arrays from numpy (huge pages on large
    arrays). Returns (slot int32|int64[n], nb, room int64[nb])."""
    slot = np.empty(n, np.int32 if n < 2**31 else np.int64)
    nxt = np.empty(n, np.int64)
    room = np.empty(n, np.int64)
    nb = _grouped_best_fit_into(cnt, start, cap, n, slot, nxt, room)
    return slot, nb, room[:nb].copy()


@njit(cache=True)
def grouped_best_fit_count(cnt, cap):
    """The pack count of best fit decreasing (:func:`grouped_best_fit`) from the size histogram alone.

    Which pack takes an item depends only on the remaining rooms, never on which pack has them, so
    best fit decreasing can run on a histogram of rooms: for the items of size ``s`` (sizes
    descending), all packs of the smallest room ``r >= s`` take ``r // s`` items each (the last one
    of them what is left), moving to room ``r - j * s``; with no such room, packs of ``cap // s``
    items open. ``cnt`` int64[cap+1] (``size_groups``). Each step empties a room bucket or ends a
    size group: at most the steps of :func:`grouped_best_fit`, with no per-item work (O(cap + steps)).
    Returns nb (int)."""
    rc = np.zeros(cap + 1, np.int64)  # packs per remaining room (room 0 not kept)
    bits, lo = _bs_new(cap + 1)
    nb = 0
    for s in range(cap, 0, -1):
        left = cnt[s]
        while left > 0:
            r = _bs_find_ge(bits, lo, s)
            if r < 0:
                q = cap // s
                full = left // q
                rem = left - full * q
                nb += full
                r2 = cap - q * s
                if full > 0 and r2 > 0:
                    if rc[r2] == 0:
                        _bs_set(bits, lo, r2)
                    rc[r2] += full
                if rem > 0:
                    nb += 1
                    r2 = cap - rem * s
                    if rc[r2] == 0:
                        _bs_set(bits, lo, r2)
                    rc[r2] += 1
                break
            j = r // s
            k = rc[r]
            if left >= k * j:
                take = k
                rem = 0
            else:
                take = left // j
                rem = left - take * j
            rc[r] -= take + (1 if rem > 0 else 0)
            if rc[r] == 0:
                _bs_clear(bits, lo, r)
            left -= take * j + rem
            r2 = r - j * s
            if take > 0 and r2 > 0:
                if rc[r2] == 0:
                    _bs_set(bits, lo, r2)
                rc[r2] += take
            if rem > 0:
                r2 = r - rem * s
                if rc[r2] == 0:
                    _bs_set(bits, lo, r2)
                rc[r2] += 1
    return nb


@njit(cache=True)
def _grouped_best_fit_into(cnt, start, cap, n, slot, nxt, room):
    """Best fit decreasing on a size histogram, one size group at a time.

    For the ``cnt[s]`` items of size ``s`` (sizes descending): the pack with the smallest room
    ``r >= s`` (ties: the pack that reached room ``r`` last) takes ``min(left, r // s)`` of them
    at once, because after one item its room ``r - s`` is again the smallest that fits while
    ``r - s >= s``; with no such pack, new packs of ``cap // s`` items each open. This is exactly
    item-by-item best fit decreasing (``best_fit`` over ``desc_order``), in O(n + cap) steps
    (each step places >= 1 item or opens packs) plus O(log64 cap) per bitset update.

    Writes ``slot[start[s] + t]``, the pack of the t-th item of size ``s`` (packs numbered in
    opening order), and ``room[b]`` for b < nb; ``nxt`` int64[n] is scratch. Returns nb."""
    head = np.full(cap + 1, -1, np.int64)
    bits, lo = _bs_new(cap + 1)
    nb = 0
    for s in range(cap, 0, -1):
        left = cnt[s]
        if left == 0:
            continue
        p = start[s]
        while left > 0:
            r = _bs_find_ge(bits, lo, s)
            if r < 0:
                q = cap // s
                while left > 0:
                    j = q if left > q else left
                    b = nb
                    nb += 1
                    for _ in range(j):
                        slot[p] = b
                        p += 1
                    left -= j
                    r2 = cap - j * s
                    room[b] = r2
                    if r2 > 0:
                        if head[r2] < 0:
                            _bs_set(bits, lo, r2)
                        nxt[b] = head[r2]
                        head[r2] = b
                break
            b = head[r]
            head[r] = nxt[b]
            if head[r] < 0:
                _bs_clear(bits, lo, r)
            j = r // s
            if j > left:
                j = left
            for _ in range(j):
                slot[p] = b
                p += 1
            left -= j
            r2 = r - j * s
            room[b] = r2
            if r2 > 0:
                if head[r2] < 0:
                    _bs_set(bits, lo, r2)
                nxt[b] = head[r2]
                head[r2] = b
    return nb


@njit(cache=True)
def _fillable(w, left, smin, vmax, v, j):
    """Whether a pack's rest room ``w`` can still be closed exactly, judged from the histogram
    ``left`` after taking ``j`` items of size ``v``: ``w == 0``; an item of size ``w`` is left; or
    ``w >= 2 * smin`` and ``k = ceil(w / vmax)`` items of sizes in [smin, vmax] can sum to ``w``
    (``k * smin <= w``; exact for a dense histogram, a heuristic otherwise)."""
    if w == 0:
        return True
    if left[w] - (j if w == v else 0) > 0:
        return True
    if w < 2 * smin:
        return False
    return ((w + vmax - 1) // vmax) * smin <= w


def grouped_exact_fill(cnt, start, cap, n, tries, target):
    """Greedy knapsack with look-ahead on a size histogram (``_grouped_exact_fill_into``, whose
    docstring has the rule). ``slot`` is int32 when ``n < 2**31`` (half the memory traffic of the
    later passes) and allocated by numpy, which asks the kernel for huge pages on large arrays
    (the size-grouped slot reads of :func:`slots_to_csr` touch ~cap pages at once). Returns
    (slot int32|int64[n], nb, loads int64[nb])."""
    slot = np.empty(n, np.int32 if n < 2**31 else np.int64)
    loads = np.empty(n, np.int64)
    nb = _grouped_exact_fill_into(cnt, start, cap, n, tries, target, slot, loads)
    return slot, nb, loads[:nb].copy()


@njit(cache=True)
def _grouped_exact_fill_into(cnt, start, cap, n, tries, target, slot, loads):
    """Greedy knapsack with look-ahead on a size histogram: one pack at a time, the largest
    remaining item first, then repeatedly the largest that fits, taking as many copies at once as
    fit; a step that would leave a rest room no remaining sizes can close (``_fillable``) takes one
    copy fewer, or, when even one copy does, the largest of the next ``tries`` smaller sizes that
    leaves a closable rest (an exact pair first in size order). Aims at packs filled exactly to
    ``cap``; on SFT length mixes it reaches fewer packs than BFD (BFD's gaps are the rest rooms
    below the smallest sizes left at the end). A pack that will close with a gap anyway (no item
    fits after the step) and would end above ``target`` (e.g. the mean load at the L2 bound;
    ``cap`` = off) closes with the largest sizes that keep it <= ``target`` instead, which pairs
    long with short items where no exact fill exists (equal loads, same pack count there).

    Repeated packs are built once: a pack's decisions read the histogram only through which sizes
    are left and, for a size ``v`` it takes, through comparisons with ``cap // v`` or less; while
    every size it takes keeps more than ``cap // v`` copies before each decision, the next pack
    repeats it exactly, so the repeats are written at once (the same packs as one at a time).

    ``cnt``/``start``: :func:`size_groups`. Each step places >= 1 item: O(n + cap) steps, each
    O(tries * log64 cap) at worst. Writes the packs in the :func:`grouped_best_fit` layout
    (``slot[start[s] + t]`` = pack of the t-th item of size s) into ``slot`` (int[n]) and their
    loads into ``loads[:nb]`` (int64[n], numpy-allocated by the caller); returns nb."""
    left = cnt.copy()
    used = np.zeros(cap + 1, np.int64)
    tu = np.zeros(cap + 1, np.int64)  # copies of each size in the pack being built
    tv = np.empty(cap + 1, np.int64)  # the sizes it takes, in first-taken order
    bits, lo = _bs_new(cap + 1)  # value v stored as cap - v: smallest stored = largest size
    for v in range(1, cap + 1):
        if left[v] > 0:
            _bs_set(bits, lo, cap - v)
    nb = 0
    placed = 0
    smin = 1
    while placed < n:
        while smin < cap and left[smin] == 0:
            smin += 1
        b = nb
        nb += 1
        load = 0
        first = True
        ntv = 0
        vmax = cap - _bs_find_ge(bits, lo, 0)
        while placed < n:
            r = cap - load
            if first:
                v = vmax
            else:
                if r < smin:
                    break
                u = _bs_find_ge(bits, lo, cap - r)
                if u < 0 or u >= cap:
                    break
                v = cap - u
            j = r // v
            if j > left[v]:
                j = left[v]
            if not _fillable(r - j * v, left, smin, vmax, v, j):
                j0 = j
                ok = False
                while j > 1:
                    j -= 1
                    if _fillable(r - j * v, left, smin, vmax, v, j):
                        ok = True
                        break
                if not ok and not first:
                    cand = v - 1
                    if cand > r - smin:
                        cand = r - smin
                    tr = 0
                    while cand >= smin and tr < tries:
                        uu = _bs_find_ge(bits, lo, cap - cand)
                        if uu < 0 or uu >= cap:
                            break
                        v2 = cap - uu
                        if v2 < smin:
                            break
                        if _fillable(r - v2, left, smin, vmax, v2, 1):
                            v = v2
                            j = 1
                            ok = True
                            break
                        cand = v2 - 1
                        tr += 1
                if not ok:
                    j = j0
            if not first and load + j * v > target and r - j * v < smin:
                # the pack closes with a gap anyway: close it nearer the target load instead
                lim = target - load
                if lim >= smin:
                    u = _bs_find_ge(bits, lo, cap - lim)
                    if u >= 0 and u < cap and cap - u >= smin:
                        v = cap - u
                        j = lim // v
                        if j > left[v]:
                            j = left[v]
            first = False
            p = start[v] + used[v]
            for q in range(j):
                slot[p + q] = b
            used[v] += j
            left[v] -= j
            if left[v] == 0:
                _bs_clear(bits, lo, cap - v)
            load += j * v
            placed += j
            if tu[v] == 0:
                tv[ntv] = v
                ntv += 1
            tu[v] += j
        loads[b] = load
        # repeats of this pack: as long as each size it takes keeps > cap // v copies left
        rep = n
        for t in range(ntv):
            v = tv[t]
            m = (left[v] - cap // v - 1) // tu[v] if left[v] > cap // v else -1
            if m < rep:
                rep = m
        if rep > 0:
            for t in range(ntv):
                v = tv[t]
                k = tu[v]
                p = start[v] + used[v]
                for m in range(1, rep + 1):
                    for q in range(k):
                        slot[p + q] = b + m
                    p += k
                used[v] += rep * k
                left[v] -= rep * k
                placed += rep * k
            for m in range(1, rep + 1):
                loads[b + m] = load
            nb += rep
        for t in range(ntv):
            tu[tv[t]] = 0
    return nb


@njit(cache=True)
def slots_to_bins(sizes, start, slot):
    """bin_of int64[n] from size-grouped slots: the t-th item (ascending index) of size ``s`` goes
    to ``slot[start[s] + t]``. O(n)."""
    n = sizes.shape[0]
    ptr = start.copy()
    bin_of = np.empty(n, np.int64)
    for i in range(n):
        s = sizes[i]
        bin_of[i] = slot[ptr[s]]
        ptr[s] += 1
    return bin_of


def slots_to_csr(sizes, start, slot, nb):
    """(offsets int64[nb+1], items int64[n]) straight from size-grouped slots: the items of pack b
    are ``items[offsets[b]:offsets[b+1]]`` in ascending index (the t-th item of size s is in
    pack ``slot[start[s] + t]``). Equals ``csr_by_bin(slots_to_bins(...), nb)``.

    O(n + nb) in three passes over the items: pack sizes from ``slot`` (sequential), then a stable
    partition of the item indices by ``pack >> shift`` into <= 256 pack ranges (256 sequential
    write streams of one int64 each: the pack's rank in its range above the item index), then
    each range is scattered into its own few kilobytes of ``items``; a direct scatter over ``nb``
    packs misses the cache on every item once the packs outgrow it. The large arrays are
    allocated by numpy (huge pages where the kernel allows: the size-grouped reads of ``slot``
    touch ~cap pages at once, which 4 KiB pages make a TLB miss per item)."""
    n = sizes.shape[0]
    off = np.empty(nb + 1, np.int64)
    items = np.empty(n, np.int64)
    if n == 0:
        off[:] = 0
        return off, items
    ibits = max(1, int(n - 1).bit_length())
    shift = max(0, int(nb - 1).bit_length() - 8)
    if ibits + shift <= 62:
        tmp = np.empty(n, np.int64)
        _slots_to_csr_packed(sizes, start, slot, nb, shift, ibits, off, tmp, items)
        return off, items
    return _slots_to_csr_pairs(sizes, start, slot, nb)


@njit(cache=True)
def _slots_to_csr_packed(sizes, start, slot, nb, shift, ibits, off, tmp, items):
    """:func:`slots_to_csr` for ``ibits + shift <= 62``: ``tmp[q] = (b - (k << shift)) << ibits | i``."""
    n = sizes.shape[0]
    off[:] = 0
    for p in range(n):
        off[slot[p] + 1] += 1
    for b in range(nb):
        off[b + 1] += off[b]
    nbk = ((nb - 1) >> shift) + 1
    bpos = np.empty(nbk, np.int64)
    for k in range(nbk):
        bpos[k] = off[k << shift]
    ptr = start.copy()
    mask = (np.int64(1) << ibits) - 1
    for i in range(n):
        s = sizes[i]
        b = np.int64(slot[ptr[s]])
        ptr[s] += 1
        k = b >> shift
        q = bpos[k]
        tmp[q] = ((b - (k << shift)) << ibits) | i
        bpos[k] = q + 1
    pos = off[:-1].copy()
    for k in range(nbk):
        base = k << shift
        hi = off[min(nb, (k + 1) << shift)]
        for q in range(off[base], hi):
            t = tmp[q]
            b = base + (t >> ibits)
            items[pos[b]] = t & mask
            pos[b] += 1


@njit(cache=True)
def _slots_to_csr_pairs(sizes, start, slot, nb):
    """:func:`slots_to_csr` with (item, pack) pairs, for inputs too large to pack both in 62 bits."""
    n = sizes.shape[0]
    shift = 0
    while ((nb - 1) >> shift) >= 256:
        shift += 1
    nbk = ((nb - 1) >> shift) + 1 if nb > 0 else 0
    bstart = np.zeros(nbk + 1, np.int64)
    for p in range(n):
        bstart[(slot[p] >> shift) + 1] += 1
    for k in range(nbk):
        bstart[k + 1] += bstart[k]
    bpos = bstart[:-1].copy()
    tmp = np.empty(2 * n, np.int64)  # (item, pack) pairs, grouped by pack range
    ptr = start.copy()
    for i in range(n):
        s = sizes[i]
        b = slot[ptr[s]]
        ptr[s] += 1
        k = b >> shift
        q = bpos[k]
        tmp[2 * q] = i
        tmp[2 * q + 1] = b
        bpos[k] = q + 1
    off = np.zeros(nb + 1, np.int64)
    for q in range(n):
        off[tmp[2 * q + 1] + 1] += 1
    for b in range(nb):
        off[b + 1] += off[b]
    pos = off[:-1].copy()
    items = np.empty(n, np.int64)
    for q in range(n):
        b = tmp[2 * q + 1]
        items[pos[b]] = tmp[2 * q]
        pos[b] += 1
    return off, items


@njit(cache=True)
def level_slots(cnt, start, slot, loads, cap, tol):
    """``level`` on size-grouped slots (see ``grouped_best_fit``): raise packs below the floor
    F = min(max_load - tol, floor(mean load)) by moving short items out of packs that stay >= F
    (largest that fits first), then by swapping one of their items for a slightly longer one
    from such a pack. Items of one size are interchangeable, so a move or swap rewrites slot
    entries only. The pack count never changes, the max load never rises. Modifies
    ``slot`` and ``loads`` (int64[nb]) in place; returns moves + swaps.

    Every candidate slot is examined once per phase (pointers per size only advance, donor loads
    only fall): O(n + cap + moves * log cap); the swap phase stops after 8 n + cap slot look-ups."""
    nb = loads.shape[0]
    if nb <= 1:
        return 0
    lmax = 0
    total = 0
    for b in range(nb):
        total += loads[b]
        if loads[b] > lmax:
            lmax = loads[b]
    F = lmax - tol
    if total // nb < F:
        F = total // nb
    T = lmax - F
    if T <= 0:
        return 0
    if T > cap:
        T = cap
    isrecv = np.zeros(nb, np.uint8)
    nrecv = 0
    for b in range(nb):
        if loads[b] < F:
            isrecv[b] = 1
            nrecv += 1
    if nrecv == 0:
        return 0
    recv = np.empty(nrecv, np.int64)
    k = 0
    for b in range(nb):
        if isrecv[b]:
            recv[k] = b
            k += 1
    # phase 1: sand moves
    P = _pow2(T + 1)
    tree = np.zeros(2 * P, np.uint8)
    ptr = start.copy()
    for v in range(1, T + 1):
        if cnt[v] > 0:
            _vt_set(tree, P, v, 1)
    moved = 0
    for k in range(nrecv):
        u = recv[k]
        while loads[u] < F:
            v = _find_le(tree, P, lmax - loads[u])
            if v <= 0:
                break
            end = start[v] + cnt[v]
            p = ptr[v]
            while p < end:
                d = slot[p]
                if isrecv[d] == 0 and loads[d] - v >= F:
                    break
                p += 1
            if p == end:
                ptr[v] = end
                _vt_set(tree, P, v, 0)
                continue
            d = slot[p]
            slot[p] = u
            loads[d] -= v
            loads[u] += v
            moved += 1
            ptr[v] = p + 1
            if p + 1 == end:
                _vt_set(tree, P, v, 0)
    # phase 2: swaps for the packs still below F
    left = 0
    for k in range(nrecv):
        if loads[recv[k]] < F:
            left += 1
        else:
            isrecv[recv[k]] = 2  # reached F: not a receiver of swaps, still never a donor
    if left == 0:
        return moved
    rid = np.full(nb, -1, np.int64)
    ru = np.empty(left, np.int64)
    k2 = 0
    for k in range(nrecv):
        if isrecv[recv[k]] == 1:
            rid[recv[k]] = k2
            ru[k2] = recv[k]
            k2 += 1
    # the receivers' slots, sizes descending: one pass over the slots records them in a fixed buffer;
    # a second pass only when they do not fit in it
    roff = np.zeros(left + 1, np.int64)
    n = slot.shape[0]
    hbuf = np.empty(min(n, max(1024, 64 * left)), np.int64)
    nh = 0
    for p in range(n):
        d = slot[p]
        if isrecv[d] == 1:
            roff[rid[d] + 1] += 1
            if nh < hbuf.shape[0]:
                hbuf[nh] = p
            nh += 1
    for r in range(left):
        roff[r + 1] += roff[r]
    rpos = np.empty(roff[left], np.int64)
    rsz = np.empty(roff[left], np.int64)
    fill = roff[:-1].copy()
    if nh <= hbuf.shape[0]:
        s = cap
        for h in range(nh):
            p = hbuf[h]
            while p >= start[s] + cnt[s]:
                s -= 1
            r = rid[slot[p]]
            rpos[fill[r]] = p
            rsz[fill[r]] = s
            fill[r] += 1
    else:
        for s in range(cap, 0, -1):
            for p in range(start[s], start[s] + cnt[s]):
                d = slot[p]
                if isrecv[d] == 1:
                    r = rid[d]
                    rpos[fill[r]] = p
                    rsz[fill[r]] = s
                    fill[r] += 1
    P2 = _pow2(cap + 1)
    tree2 = np.zeros(2 * P2, np.uint8)
    q = start.copy()
    for v in range(1, cap + 1):
        if cnt[v] > 0:
            _vt_set(tree2, P2, v, 1)
    swaps = 0
    budget = 8 * n + cap  # probes of the swap phase: keeps it linear where few swaps exist
    for r in range(left):
        u = ru[r]
        progress = True
        while loads[u] < F and progress and budget > 0:
            progress = False
            for k in range(roff[r], roff[r + 1]):
                sa = rsz[k]
                room = lmax - loads[u]
                if room > T:
                    room = T
                if room <= 0:
                    break
                v = _find_le(tree2, P2, sa + room)
                found = -1
                tries = 0
                while v > sa and tries < 64 and budget > 0:
                    tries += 1
                    end = start[v] + cnt[v]
                    p = q[v]
                    while p < end and (isrecv[slot[p]] != 0 or loads[slot[p]] <= F):
                        p += 1  # packs at or below F can give nothing any more
                    q[v] = p
                    if p == end:
                        _vt_set(tree2, P2, v, 0)
                    else:
                        delta = v - sa
                        lim = p + 64
                        if lim > end:
                            lim = end
                        budget -= lim - p + 1
                        while p < lim:
                            d = slot[p]
                            if isrecv[d] == 0 and loads[d] - delta >= F:
                                found = p
                                break
                            p += 1
                        if found >= 0:
                            break
                    v = _find_le(tree2, P2, v - 1)
                if found < 0:
                    continue
                d = slot[found]
                delta = v - sa
                slot[found] = u
                slot[rpos[k]] = d
                loads[u] += delta
                loads[d] -= delta
                rpos[k] = found
                rsz[k] = v
                swaps += 1
                progress = True
                if loads[u] >= F:
                    break
    return moved + swaps


@njit(cache=True)
def csr_and_loads(bin_of, nb, sizes):
    """``csr_by_bin`` and ``loads_of`` in two passes over the items instead of three."""
    n = bin_of.shape[0]
    off = np.zeros(nb + 1, np.int64)
    loads = np.zeros(nb, np.int64)
    for i in range(n):
        b = bin_of[i]
        off[b + 1] += 1
        loads[b] += sizes[i]
    for b in range(nb):
        off[b + 1] += off[b]
    pos = off[:-1].copy()
    items = np.empty(n, np.int64)
    for i in range(n):
        b = bin_of[i]
        items[pos[b]] = i
        pos[b] += 1
    return off, items, loads


def shuffle_buckets(lab, u, vals):
    """A uniformly random permutation of ``0..m-1`` (Rao-Sandelius 1961) and ``vals`` in its order:
    every element goes to the bucket ``lab[i]`` (uint8, uniform in 0..255; buckets keep the element
    order), then each bucket is shuffled by Fisher-Yates with ``j = (u[t] * (t + 1)) >> 32`` (``u``
    uint32[m] uniform). Both passes touch one cache-sized bucket at a time, where an in-place
    Fisher-Yates over ``m`` > the cache misses it on every swap. Returns (perm int64[m],
    ``vals[perm]`` int64[m]), ``vals`` int64[m] (carried along: no random gather afterwards). The
    outputs are allocated by numpy (huge pages on large arrays: fewer TLB misses in the scatter).
    When ``m - 1`` and ``max(vals)`` (``vals`` >= 0) fit in 63 bits together, each element travels
    as one int64 ``i << vbits | vals[i]`` (half the write streams of the scatter and half the swaps;
    the same permutation)."""
    m = lab.shape[0]
    out = np.empty(m, np.int64)
    vout = np.empty(m, np.int64)
    vmax = int(vals.max()) if m else 0
    vmin = int(vals.min()) if m else 0
    vbits = max(1, vmax.bit_length())
    if vmin >= 0 and max(1, int(m - 1).bit_length()) + vbits <= 63:
        _shuffle_buckets_packed(lab, u, vals, vbits, out, vout)
    else:
        _shuffle_buckets_into(lab, u, vals, out, vout)
    return out, vout


@njit(cache=True)
def _bucket_offsets(lab):
    """Where each of the 256 buckets of ``lab`` (uint8[m]) starts in bucket order: ``cnt`` int64[257]
    (bucket ``k`` is ``cnt[k]:cnt[k + 1]``, ``cnt[256] == m``) and ``pos``, a copy of ``cnt[:256]`` to
    advance as the scatter fills the buckets."""
    cnt = np.zeros(257, np.int64)
    for i in range(lab.shape[0]):
        cnt[lab[i] + 1] += 1
    for k in range(256):
        cnt[k + 1] += cnt[k]
    return cnt, cnt[:256].copy()


@njit(cache=True)
def _shuffle_buckets_packed(lab, u, vals, vbits, out, vout):
    """:func:`shuffle_buckets` with ``i << vbits | vals[i]`` in one int64 (``out`` is the scratch)."""
    m = lab.shape[0]
    cnt, pos = _bucket_offsets(lab)
    for i in range(m):
        k = lab[i]
        vout[pos[k]] = (np.int64(i) << vbits) | vals[i]
        pos[k] += 1
    for k in range(256):
        a = cnt[k]
        for t in range(cnt[k + 1] - a - 1, 0, -1):
            j = (np.uint64(u[a + t]) * np.uint64(t + 1)) >> np.uint64(32)
            x = vout[a + t]
            vout[a + t] = vout[a + j]
            vout[a + j] = x
    mask = (np.int64(1) << vbits) - 1
    for i in range(m):
        x = vout[i]
        out[i] = x >> vbits
        vout[i] = x & mask


@njit(cache=True)
def _shuffle_buckets_into(lab, u, vals, out, vout):
    """:func:`shuffle_buckets` writing into ``out`` and ``vout`` (int64[m])."""
    m = lab.shape[0]
    cnt, pos = _bucket_offsets(lab)
    for i in range(m):
        k = lab[i]
        out[pos[k]] = i
        vout[pos[k]] = vals[i]
        pos[k] += 1
    for k in range(256):
        a = cnt[k]
        for t in range(cnt[k + 1] - a - 1, 0, -1):
            j = (np.uint64(u[a + t]) * np.uint64(t + 1)) >> np.uint64(32)
            x = out[a + t]
            out[a + t] = out[a + j]
            out[a + j] = x
            y = vout[a + t]
            vout[a + t] = vout[a + j]
            vout[a + j] = y
