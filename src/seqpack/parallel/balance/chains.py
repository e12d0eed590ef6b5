"""Ejection chains for the steps still above the token goal, the last pass of the band schedule.

A full step ``S`` above ``token_tolerance`` gets a load window ``[a, a + w]`` (``w`` the widest that keeps
its spread within the goal); each rank outside it is brought in by a short **chain** of sample moves
through packs of other full steps: the rank's pack swaps a sample for one of another length, takes a
sample in, or sends one out (the last two change the packs' sample counts, which the length-matched swaps
of :mod:`~seqpack.parallel.balance._band_kernels` never do); the partner pack then holds a different load,
and when that takes its own step outside its allowed range it passes the change on the same way (up to
:data:`_DEPTH` links, each through a step not yet in the chain). A partner step's allowed range keeps its
token spread within ``max(its own, tt)``; no pack goes above the capacity or becomes empty. A window's
chains are undone unless every rank of ``S`` ends inside it, ``S`` ends within the goal, and no step's
cost max/mean rises above ``max(its own, min(the plan's worst, 1 + ct / 4))``. Plain Python over a few
packs; a budget of candidate links (:data:`_BUDGET` per step) bounds the time.
"""

from __future__ import annotations

import numpy as np

from seqpack.parallel.balance.cost import step_figures
from seqpack.parallel.balance.schedule import FILLER, is_full

_DEPTH = 3  # links of one chain (packs of other steps it passes through)
_K = 8  # samples tried per (pack, length) at each link
_BUDGET = 12000  # candidate links examined per window
_TOTAL = 40000  # candidate links examined per call, all steps and windows together
_WINDOWS = 6  # windows tried per off-target step
_XCOST = 0.25  # cost max/mean cap: max(own, min(plan's worst, 1 + _XCOST * ct))


class _RowDict(dict):
    """Per-step rank rows (Python lists), built on first use from a ``[steps, dp]`` numpy array."""

    def __init__(self, full, cast):
        super().__init__()
        self.full, self.cast = full, cast

    def __missing__(self, k):
        row = [self.cast(x) for x in self.full[k]]
        self[k] = row
        return row


class _State:
    """Mutable plan: members per pack, pack loads/costs, per-step rank loads; every change is logged.
    Python rows are built only for the packs and steps a chain reaches."""

    def __init__(self, bins, grids, units, cap, dp, mb, tt, ct):
        self.units, self.cap, self.dp, self.bins = units, cap, dp, bins
        npk = len(bins)
        self.pack_of = np.empty(units.shape[0], dtype=np.int64)
        sizes = np.fromiter((len(b) for b in bins), dtype=np.int64, count=npk)
        self.pack_of[np.concatenate(bins)] = np.repeat(np.arange(npk), sizes)
        u = units.astype(np.float64)
        self.load = np.bincount(self.pack_of, weights=u, minlength=npk).astype(np.int64)
        self.cost = np.bincount(self.pack_of, weights=u ** 2, minlength=npk)
        self.steps = [k for k, g in enumerate(grids) if is_full(g, mb)]
        self.step_of = np.full(npk, -1, dtype=np.int64)  # full steps only; -1 = remainder step (never touched)
        self.rank_of = np.zeros(npk, dtype=np.int64)
        full = [grids[k] for k in self.steps]
        g = np.stack(full) if full else np.zeros((0, dp, mb), dtype=np.int64)  # [S, dp, mb]
        self.step_of[g.reshape(-1)] = np.repeat(np.array(self.steps, dtype=np.int64), dp * mb)
        self.rank_of[g.reshape(-1)] = np.tile(np.repeat(np.arange(dp), mb), len(self.steps))
        tl = np.zeros((len(grids), dp))
        cl = np.zeros((len(grids), dp))
        if full:
            tl[self.steps] = self.load[g].sum(axis=2)
            cl[self.steps] = self.cost[g].sum(axis=2)
        self.fig_all = step_figures(tl[self.steps], cl[self.steps]) if full else (np.zeros(0), np.zeros(0))
        self.tl, self.cl = _RowDict(tl, lambda x: int(round(x))), _RowDict(cl, float)
        self.members = {}
        self.log = []
        self.tt = tt
        worst = float(self.fig_all[1].max()) if full else 1.0
        self.ccap = min(worst, 1.0 + _XCOST * ct)
        self.width, self.climit = {}, {}
        self.target = -1  # the step being evened
        self.total = [_TOTAL]  # candidate links left for the call
        self.failed = {}  # pack -> load changes no chain reaches from the committed plan

    def to_lists(self):
        """Python lists for the search (numpy scalar access is slow); the arrays stay for the numpy passes."""
        self.arrays = (self.step_of, self.rank_of, self.load)
        self.step_of, self.rank_of = self.step_of.tolist(), self.rank_of.tolist()
        self.load, self.cost = self.load.tolist(), self.cost.tolist()
        self.pack_of, self.units = self.pack_of.tolist(), self.units.tolist()

    def mem(self, p):
        """Members of pack ``p`` (a Python list, built on first use)."""
        m = self.members.get(p)
        if m is None:
            m = self.members[p] = [int(x) for x in self.bins[p]]
        return m

    def limits(self, k):
        """``(width, spread limit, cost limit)`` of step ``k``, fixed at the first look: its rank-load range
        may grow to the goal's (``floor(tt * mean)``), its token spread to ``max(own, tt)``, its cost
        max/mean to ``max(own, ccap)``."""
        if k not in self.width:
            t = self.tl[k]
            self.width[k] = max(max(t) - min(t), int(np.floor(self.tt * sum(t) / len(t) * (1.0 - self.tt))))
            sp, cr = self.figures(k)
            self.climit[k] = (max(sp, self.tt), max(cr, self.ccap))
        return self.width[k], self.climit[k][0], self.climit[k][1]

    def commit(self):
        """Keep the logged moves: the changed steps' limits are taken afresh from their new figures."""
        for k in self.touched(0):
            self.width.pop(k, None)
            self.climit.pop(k, None)
        self.log.clear()
        self.failed.clear()

    def figures(self, k):
        t, c = self.tl[k], self.cl[k]
        tm, cm = max(sum(t) / len(t), 1e-12), max(sum(c) / len(c), 1e-12)
        return (max(t) - min(t)) / tm, max(c) / cm

    def _shift(self, p, dt, dc):
        k = self.step_of[p]
        self.limits(k)  # taken before the first change
        self.load[p] += dt
        self.cost[p] += dc
        self.tl[k][self.rank_of[p]] += dt
        self.cl[k][self.rank_of[p]] += dc

    def move(self, s, q):
        """Sample ``s`` from its pack into pack ``q`` (logged)."""
        p = self.pack_of[s]
        u = self.units[s]
        self.mem(p).remove(s)
        self.mem(q).append(s)
        self.pack_of[s] = q
        self._shift(p, -u, -float(u) ** 2)
        self._shift(q, u, float(u) ** 2)
        self.log.append((s, p))

    def undo_to(self, mark):
        while len(self.log) > mark:
            s, p = self.log.pop()
            self.move(s, p)
            self.log.pop()

    def touched(self, mark):
        """Full steps holding a pack changed since log position ``mark``."""
        return {self.step_of[p] for _, p in self.log[mark:]} | {self.step_of[self.pack_of[s]] for s, _ in self.log[mark:]}

    def steps_ok(self, mark):
        """Every step changed since ``mark`` but the one being evened (``self.target``; judged when its
        window is done) within its token spread and cost max/mean limits (:meth:`limits`)."""
        for k in self.touched(mark) - {self.target}:
            sp, cr = self.figures(k)
            _, sl, cl = self.limits(k)
            if sp > sl or cr > cl:
                return False
        return True

    def pack_range(self, p):
        """Loads pack ``p`` may take keeping its step's rank loads within ``self.width`` (others fixed)."""
        k, r = self.step_of[p], self.rank_of[p]
        t = self.tl[k]
        others = t[:r] + t[r + 1:]
        w = self.limits(k)[0]
        lo, hi = max(others) - w, min(others) + w
        rest = t[r] - self.load[p]
        return max(lo - rest, 1), min(hi - rest, self.cap)


def _links(st, p, need_lo, need_hi, used, by_len, skip=()):
    """Candidate first links for pack ``p`` (load change wanted in ``[need_lo, need_hi]``): ``(s, j)`` =
    swap sample ``s`` of ``p`` with sample ``j``; ``(s, ~q)`` = sample ``s`` out to pack ``q``; ``(None, j)``
    = sample ``j`` in. Smallest changes first (none in ``skip``); partners in full steps outside ``used``."""
    units = st.units
    lp = st.load[p]
    for s in list(st.mem(p)) + [None]:
        a = 0 if s is None else units[s]
        for d in sorted(range(need_lo, need_hi + 1), key=abs):
            b = a + d  # the length that replaces a (0: s only goes out)
            if d == 0 or d in skip or b < 0 or (b == 0 and (s is None or len(st.mem(p)) < 2)) or lp + d > st.cap:
                continue
            if b == 0:
                for q in _rooms(st, a, used, p):
                    yield s, ~q
                continue
            k = 0
            if b >= by_len[1].shape[0] - 1:
                continue
            srt, vstart = by_len
            for j in srt[vstart[b]:vstart[b + 1]].tolist():
                q = st.pack_of[j]
                if q != p and st.step_of[q] >= 0 and st.step_of[q] not in used and (s is not None or
                                                                                    len(st.mem(q)) >= 2):
                    yield s, j
                    k += 1
                    if k >= _K:
                        break


def _chain(st, p, need_lo, need_hi, depth, used, by_len, budget, mark0, skip=()):
    """Bring pack ``p``'s load change into ``[need_lo, need_hi]`` by one link (and, when its partner leaves
    its range, up to ``depth - 1`` further links; every one-link answer is tried before a longer one).
    Applies the moves (logged) and returns True, or returns False with the state unchanged."""
    units = st.units
    for deeper in ((False, True) if depth > 1 else (False,)):
        for s, j in _links(st, p, need_lo, need_hi, used, by_len, skip):
            budget[0] -= 1
            if budget[0] < 0:
                return False
            a = 0 if s is None else units[s]
            q = ~j if j < 0 else int(st.pack_of[j])
            new_q = int(st.load[q]) + (a if j < 0 else a - int(units[j]))
            lo, hi = st.pack_range(q)  # q's range does not depend on q's own load
            if (lo <= new_q <= hi) == deeper:  # one link: q in its range; longer: q passes it on
                continue
            mark = len(st.log)
            if j < 0:  # s goes out to pack q
                st.move(s, q)
            else:
                st.move(j, p)
                if s is not None:
                    st.move(s, q)
            if not deeper and st.steps_ok(mark0):
                return True
            if deeper and _chain(st, q, lo - new_q, hi - new_q, depth - 1, used | {st.step_of[q]}, by_len,
                                 budget, mark0):
                return True
            st.undo_to(mark)
    return False


def _rooms(st, a, used, p):
    """Up to :data:`_K` packs of other full steps (not in ``used``) that can take ``a`` more units within
    their range (candidates: ``st.roomy``, the packs with room for the shortest sample)."""
    out = []
    for q in st.roomy:
        if q != p and st.step_of[q] not in used:
            lo, hi = st.pack_range(q)
            if lo <= st.load[q] + a <= hi:
                out.append(q)
                if len(out) >= _K:
                    break
    return out


def _roomy(st, tol, least):
    """Packs of full steps whose rank may rise ``least`` units with the step's spread within
    ``max(own, tol)`` (the other ranks fixed): the candidates of :func:`_rooms`, one numpy pass."""
    if not st.steps:
        return []
    tl = st.tl.full[st.steps]
    w = np.maximum(tl.max(1) - tl.min(1), np.floor(tol * tl.mean(1) * (1.0 - tol)))
    srt = np.sort(tl, axis=1)
    omin = np.where(tl == srt[:, :1], srt[:, 1:2], srt[:, :1])  # the smallest of the other ranks
    step_of, rank_of, load = st.arrays
    ok = (omin + w[:, None] - tl >= least)[np.searchsorted(st.steps, step_of.clip(0)), rank_of]
    ok &= (step_of >= 0) & (load + least <= st.cap)
    return np.flatnonzero(ok).tolist()


def _fit_window(st, grid, s, a, w, by_len):
    """Bring every rank of step ``s`` (``grid``: its ``[dp, m]`` pack ids) into ``[a, a + w]`` by chains
    (iterative deepening to :data:`_DEPTH` links, :data:`_BUDGET` candidate links per window). True when
    all ranks are in (the moves stay applied and logged), else False (the caller undoes the log)."""
    b0 = max(min(_BUDGET, st.total[0]), 0)
    budget = [b0]
    for r in sorted(range(st.dp), key=lambda r: -max(a - st.tl[s][r], st.tl[s][r] - a - w)):
        x = st.tl[s][r]
        if a <= x <= a + w:
            continue
        packs = [int(p) for p in grid[r] if p != FILLER]
        fresh = not st.log  # the committed plan: a change proven out of reach stays so for this step
        if not any(_chain(st, p, a - x, a + w - x, depth, {s}, by_len, budget, 0, st.failed.get(p, ()) if fresh
                          else ()) for depth in range(1, _DEPTH + 1) for p in packs):
            if fresh and budget[0] >= 0:  # searched to the end: no chain makes any of these changes
                for p in packs:
                    st.failed.setdefault(p, set()).update(range(a - x, a + w - x + 1))
            st.total[0] -= b0 - max(budget[0], 0)
            return False
    st.total[0] -= b0 - max(budget[0], 0)
    return True


def chain_steps(bins, grids, padded, capacity, pad, dp, mb, tt, ct):
    """The ejection-chain pass on a finished plan (``bins``: int64 sample indices per pack; ``grids``: step
    grids ``[dp, m]`` of pack ids) for the full steps whose token spread is above ``tt``, worst first.
    Returns new ``bins`` (same pack ids, so ``grids`` still hold; no pack empty, none above ``capacity``,
    every sample in exactly one pack), or ``bins`` itself when nothing changed."""
    units = (np.asarray(padded) // pad).astype(np.int64)
    st = _State(bins, grids, units, int(capacity // pad), dp, mb, tt, ct)
    spread = st.fig_all[0]
    if len(st.steps) < 2 or not np.any(spread > tt):
        return bins
    off = [st.steps[i] for i in np.argsort(-spread, kind="stable") if spread[i] > tt]
    st.to_lists()
    srt = np.argsort(units, kind="stable").astype(np.int64)
    by_len = (srt, np.searchsorted(units[srt], np.arange(int(units.max()) + 2)).astype(np.int64))
    st.roomy = _roomy(st, tt, int(units.min()))
    changed = False
    for s in off:
        t = st.tl[s]
        if (max(t) - min(t)) / (sum(t) / len(t)) <= tt:  # evened meanwhile (a partner of an earlier chain)
            continue
        lo_t, hi_t = min(t), max(t)
        w = int(np.floor(tt * lo_t * (1.0 - tt)))
        rigid = [all(len(st.mem(p)) < 2 for p in grids[s][r] if p != FILLER) for r in range(dp)]
        # windows holding the ranks of one-sample packs first (those move only by whole samples), then
        # the fewest ranks outside, then the least distance
        wins = sorted(range(lo_t - w, hi_t + 1), key=lambda a: (
            sum(rg and not a <= x <= a + w for x, rg in zip(t, rigid)), sum(not a <= x <= a + w for x in t),
            sum(max(a - x, 0, x - a - w) for x in t)))
        for a in wins[:_WINDOWS]:
            st.target = s
            if (_fit_window(st, grids[s], s, a, w, by_len) and st.figures(s)[0] <= tt
                    and st.figures(s)[1] <= st.limits(s)[2]):
                st.commit()
                changed = True
                break
            st.undo_to(0)
    if not changed:
        return bins
    return [np.asarray(sorted(st.members[k]), dtype=np.int64) if k in st.members else b for k, b in enumerate(bins)]
