"""numba kernel behind ``balanced_best_fit`` on large inputs (private): re-pairing of the packs that
hold one or two items, on size-grouped slots (the layout of ``_kernels.grouped_best_fit``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def pair_slots(cnt, start, slot, loads):
    """Re-pair the one- and two-item packs of a size-grouped plan so that their loads are as even
    as a pairing allows; the pack count and every other pack stay as they are.

    Each such pack keeps its larger item (the "head"; a one-item pack's only item) and gets a new
    partner: the heads in ascending size are matched with the smaller items of the two-item packs
    in descending size, the one-item packs' missing partners counting as size 0 (so the longest
    heads stay alone). Anti-sorted matching minimises the largest and maximises the smallest sum
    over all matchings of the same two multisets, so no load rises above the old maximum (no pack
    over capacity) and none falls below the old minimum: the load spread never grows.

    Args:
        cnt: int64[cap+1], items per size; start: int64[cap+2], where each size's slots begin
            (``_kernels.size_groups``).
        slot: int32|int64[n], ``slot[start[s] + t]`` = pack of the t-th item of size s; modified
            in place.
        loads: int64[nb], pack loads in units; modified in place.

    Returns the number of packs re-paired (0 when fewer than two packs qualify). O(n + cap + nb).
    """
    nb = loads.shape[0]
    if nb < 2:
        return 0
    state = np.zeros(nb, np.uint8)
    heads = np.empty(nb, np.int64)  # slot positions of the heads, sizes descending
    mins = np.empty(nb, np.int64)  # slot positions of the partners, sizes descending
    hsz = np.empty(nb, np.int64)
    msz = np.empty(nb, np.int64)
    return _pair_slots_into(cnt, start, slot, loads, state, heads, mins, hsz, msz)


@njit(cache=True)
def _pair_slots_into(cnt, start, slot, loads, state, heads, mins, hsz, msz):
    """:func:`pair_slots` with its scratch arrays (uint8[nb], int64[nb] x 4) from the caller."""
    n = slot.shape[0]
    cap = cnt.shape[0] - 1
    for p in range(n):  # state: items per pack, saturating at 3
        b = slot[p]
        if state[b] < 3:
            state[b] += 1
    nh = 0
    nm = 0
    for s in range(cap, 0, -1):  # sizes descending: a pack's first item met is its head
        for p in range(start[s], start[s] + cnt[s]):
            b = slot[p]
            st = state[b]
            if st == 1 or st == 2:
                heads[nh] = p
                hsz[nh] = s
                nh += 1
                state[b] = 4 if st == 2 else 5  # 4: partner still to come; 5: done
            elif st == 4:
                mins[nm] = p
                msz[nm] = s
                nm += 1
                state[b] = 5
    if nh < 2 or nm == 0:
        return 0
    for k in range(nh):
        h = heads[nh - 1 - k]  # heads ascending
        b = slot[h]
        load = hsz[nh - 1 - k]
        if k < nm:  # partners descending; the last nh - nm heads stay alone
            slot[mins[k]] = b
            load += msz[k]
        loads[b] = load
    return nh
