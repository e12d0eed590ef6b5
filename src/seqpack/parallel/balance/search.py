"""Local search over whole packs of a schedule (used by :func:`~seqpack.parallel.balance.balance_packs`).

Both searches swap packs between full steps, in place on the step grids, and keep a swap only when it
lowers the step score of :func:`~seqpack.parallel.balance.cost.score_parts`: :func:`refine_pairs`
between neighbouring steps, :func:`repair_worst` from the worst step to the best partner slot.
"""

from __future__ import annotations

import numpy as np

from seqpack.parallel.balance.cost import score_parts
from seqpack.parallel.balance.schedule import is_full


def refine_pairs(steps, tokens, cost, mb, passes, tt, ct, window=2) -> None:
    """Pairwise swaps between nearby full steps (in place), vectorised over all swap pairs.

    A swap is kept when it lowers the pair's score ``max(token part, cost part)`` without pushing
    either part of either step above ``max(its old pair value, 1)`` (1 = on target), so fixing one
    metric never spoils the other beyond its target.
    """
    full = [k for k, s in enumerate(steps) if is_full(s, mb)]
    for _ in range(passes):
        improved = 0
        pairs = [(full[x], full[x + d]) for d in range(1, window + 1) for x in range(len(full) - d)]
        for a, b in pairs:
            A, B = steps[a], steps[b]
            tla, cla = tokens[A].sum(1).astype(np.float64), cost[A].sum(1)
            tlb, clb = tokens[B].sum(1).astype(np.float64), cost[B].sum(1)
            tpa, cpa = score_parts(tla, cla, tt, ct)
            tpb, cpb = score_parts(tlb, clb, tt, ct)
            cur = max(tpa, cpa, tpb, cpb)
            if cur <= 1.0:
                continue
            t_lim, c_lim = max(tpa, tpb, 1.0), max(cpa, cpb, 1.0)
            dp = A.shape[0]
            fa, fb = A.reshape(-1), B.reshape(-1)  # flat slot f belongs to rank f // mb
            ea = np.eye(dp)[np.arange(fa.size) // mb]
            eb = np.eye(dp)[np.arange(fb.size) // mb]
            dt = tokens[fb][None, :].astype(np.float64) - tokens[fa][:, None]  # [na, nb]: B's pack in, A's out
            dc = cost[fb][None, :] - cost[fa][:, None]
            t1, c1 = score_parts(tla + dt[:, :, None] * ea[:, None, :], cla + dc[:, :, None] * ea[:, None, :], tt, ct)
            t2, c2 = score_parts(tlb - dt[:, :, None] * eb[None, :, :], clb - dc[:, :, None] * eb[None, :, :], tt, ct)
            tnew, cnew = np.maximum(t1, t2), np.maximum(c1, c2)
            sc = np.maximum(tnew, cnew)
            sc[(tnew > t_lim + 1e-12) | (cnew > c_lim + 1e-12)] = np.inf
            i, j = np.unravel_index(int(np.argmin(sc)), sc.shape)
            if sc[i, j] < cur - 1e-9:
                A.reshape(-1)[i], B.reshape(-1)[j] = fb[j], fa[i]
                improved += 1
        if not improved:
            break


def _excl(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For loads ``[..., dp]``: max and min over the *other* ranks, for every rank (top-2 trick)."""
    dp = x.shape[-1]
    if dp == 1:
        return np.full_like(x, -np.inf), np.full_like(x, np.inf)
    srt = np.sort(x, axis=-1)
    top1, top2 = srt[..., -1:], srt[..., -2:-1]
    low1, low2 = srt[..., :1], srt[..., 1:2]
    amax = np.argmax(x, axis=-1)[..., None] == np.arange(dp)
    amin = np.argmin(x, axis=-1)[..., None] == np.arange(dp)
    return np.where(amax, top2, top1), np.where(amin, low2, low1)


def repair_worst(steps, tokens, cost, mb, budget, tt, ct, neighbours=64, samples=128, seed=0,
                  wt: float = 1.0, wc: float = 1.0) -> None:
    """Min-max repair: the worst full step swaps one pack with the best slot of any other full step.

    Kept swaps lower the worst step's score, leave the partner below that score, and never raise the
    plan's worst token part or worst cost part (Pareto-monotone); a step no swap can help is skipped.
    Partners: the ``neighbours`` nearest steps in cost order and ``samples`` random ones (bounded
    work per repair: ``O(dp*mb * (2*neighbours+samples) * dp*mb)``).
    """
    full = [k for k, s in enumerate(steps) if is_full(s, mb)]
    if len(full) < 2:
        return
    grid = np.stack([steps[k] for k in full])  # [S, dp, mb]
    S, dp, _ = grid.shape
    na = dp * mb
    tok = tokens.astype(np.float64)
    rank_of = np.arange(na) // mb
    tl = tok[grid].sum(-1)  # [S, dp]
    cl = cost[grid].sum(-1)
    stuck = np.zeros(S, dtype=bool)
    rng = np.random.default_rng(seed)
    for _ in range(budget):
        tp, cp = score_parts(tl, cl, tt, ct)
        sc = np.where(stuck, -np.inf, np.maximum(wt * tp, wc * cp))
        a = int(np.argmax(sc))
        cur = float(sc[a])
        if cur <= 1.0:
            break
        t_lim, c_lim = max(float(tp.max()), 1.0), max(float(cp.max()), 1.0)  # global worsts never grow
        fa = grid[a].reshape(-1)
        # partner candidates: the steps nearest in cost order plus a seeded random sample (bounded work)
        if S <= 2 * neighbours + samples:
            cand = np.arange(S)
        else:
            near = np.arange(max(0, a - neighbours), min(S, a + neighbours + 1))
            cand = np.unique(np.concatenate([near, rng.choice(S, samples, replace=False)]))
        cand = cand[cand != a]
        if cand.size == 0:
            break
        flat = grid.reshape(S, na)[cand]  # [C, na]
        tlc, clc = tl[cand], cl[cand]
        dt = tok[flat][None, :, :] - tok[fa][:, None, None]  # [na(i in A), C, na(j in B)]
        dc = cost[flat][None, :, :] - cost[fa][:, None, None]
        ra, rb = rank_of, rank_of
        # step A after the swap: rank ra[i] gains dt
        tmx, tmn = _excl(tl[a])
        cmx, _ = _excl(cl[a])
        va = tl[a][ra][:, None, None] + dt
        ua = cl[a][ra][:, None, None] + dc
        ta_new = (np.maximum(tmx[ra][:, None, None], va) - np.minimum(tmn[ra][:, None, None], va)) / (
            np.maximum((tl[a].sum() + dt) / dp, 1e-12)) / tt
        ca_new = (np.maximum(cmx[ra][:, None, None], ua) / np.maximum((cl[a].sum() + dc) / dp, 1e-12) - 1.0) / ct
        # step B after the swap: rank rb[j] loses dt
        bmx, bmn = _excl(tlc)  # [C, dp]
        bcmx, _ = _excl(clc)
        vb = tlc[:, rb][None, :, :] - dt
        ub = clc[:, rb][None, :, :] - dc
        tb_new = (np.maximum(bmx[:, rb][None], vb) - np.minimum(bmn[:, rb][None], vb)) / (
            np.maximum((tlc.sum(-1)[None, :, None] - dt) / dp, 1e-12)) / tt
        cb_new = (np.maximum(bcmx[:, rb][None], ub) / np.maximum((clc.sum(-1)[None, :, None] - dc) / dp, 1e-12)
                  - 1.0) / ct
        new = np.maximum(wt * ta_new, wc * ca_new)  # the worst step's new score
        bad = (ta_new > t_lim + 1e-12) | (tb_new > t_lim + 1e-12) | (ca_new > c_lim + 1e-12) | (cb_new > c_lim + 1e-12)
        new = np.where(bad | (np.maximum(wt * tb_new, wc * cb_new) >= cur), np.inf, new)
        i, bc, j = np.unravel_index(int(np.argmin(new)), new.shape)
        if not new[i, bc, j] < cur - 1e-9:
            stuck[a] = True
            continue
        b = int(cand[bc])
        pa, pb = int(fa[i]), int(flat[bc, j])
        grid[a].reshape(-1)[i], grid[b].reshape(-1)[j] = pb, pa
        for k in (a, b):
            tl[k] = tok[grid[k]].sum(-1)
            cl[k] = cost[grid[k]].sum(-1)
    for n, k in enumerate(full):
        steps[k][...] = grid[n]
