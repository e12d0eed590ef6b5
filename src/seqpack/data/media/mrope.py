"""Multi-axis RoPE positions (Qwen2-VL M-RoPE) of one sample and of a packed row."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["mrope_position_ids", "packed_mrope_position_ids"]


def mrope_position_ids(input_ids: np.ndarray, image_grid_thw: np.ndarray, merge_size: int, image_pad_id: int) -> np.ndarray:
    """Multi-axis RoPE positions of one sample (Qwen2-VL M-RoPE), int64 ``[3, L]``.

    Follows transformers' ``Qwen2VLModel.get_rope_index`` for a single unpadded sequence: text
    tokens (``<|vision_start|>``/``<|vision_end|>`` included) count up on all three axes; the
    ``<|image_pad|>`` run of image ``k`` with grid ``(t, h, w)`` gets ``(start + ti, start + hi,
    start + wi)`` over the merged grid ``(t, h // merge_size, w // merge_size)`` in row-major order, and
    the text after it continues at ``start + max(h, w) // merge_size``.

    Raises:
        ValueError: an image run whose length differs from its grid's token count, or more/fewer
            runs than grids.
    """
    ids = np.asarray(input_ids)
    grid = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    n = len(ids)
    out = np.empty((3, n), np.int64)
    is_img = ids == image_pad_id
    edges = np.flatnonzero(np.diff(is_img.astype(np.int8))) + 1
    bounds = np.concatenate(([0], edges, [n]))
    cur = 0
    k = 0
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if b <= a:
            continue
        if not is_img[a]:
            out[:, a:b] = cur + np.arange(b - a)
            cur += b - a
            continue
        if k >= len(grid):
            raise ValueError(f"{k + 1} image-token runs but only {len(grid)} image grids")
        gt, gh, gw = int(grid[k, 0]), int(grid[k, 1]) // merge_size, int(grid[k, 2]) // merge_size
        if gt * gh * gw != b - a:
            raise ValueError(f"image run {k} has {b - a} tokens but its grid {grid[k].tolist()} implies {gt * gh * gw}")
        tt, hh, ww = np.meshgrid(np.arange(gt), np.arange(gh), np.arange(gw), indexing="ij")
        out[0, a:b] = tt.reshape(-1) + cur
        out[1, a:b] = hh.reshape(-1) + cur
        out[2, a:b] = ww.reshape(-1) + cur
        cur += max(int(grid[k, 1]), int(grid[k, 2])) // merge_size
        k += 1
    if k != len(grid):
        raise ValueError(f"{k} image-token runs but {len(grid)} image grids")
    return out


def packed_mrope_position_ids(media: Sequence[dict | None] | None, cu_seqlens, cu_seqlens_padded) -> np.ndarray | None:
    """Per-segment M-RoPE positions of a packed row, int64 ``[3, T]``; ``None`` if no segment has them.

    Segment ``j`` gets its sample's ``media["mrope_position_ids"]`` (text-only segments: ``arange`` on
    all three axes), restarting per segment; its alignment/tail padding keeps counting from the
    segment's largest position + 1 (the spec's position convention, on every axis).
    """
    if not media or not any(m and "mrope_position_ids" in m for m in media):
        return None
    cu = np.asarray(cu_seqlens, np.int64)
    cup = np.asarray(cu_seqlens_padded, np.int64)
    out = np.empty((3, int(cup[-1])), np.int64)
    for j in range(len(cup) - 1):
        real = int(cu[j + 1] - cu[j])
        a, b = int(cup[j]), int(cup[j + 1])
        m = media[j] if j < len(media) else None
        if m and "mrope_position_ids" in m:
            seg = np.asarray(m["mrope_position_ids"], np.int64)
            if seg.shape != (3, real):
                raise ValueError(f"segment {j}: mrope_position_ids has shape {seg.shape}, expected (3, {real})")
        else:
            seg = np.broadcast_to(np.arange(real, dtype=np.int64), (3, real))
        out[:, a : a + real] = seg
        if b > a + real:
            start = int(seg.max()) + 1 if real else 0  # an empty (tail) segment counts its padding from 0
            out[:, a + real : b] = start + np.arange(b - a - real)
    return out
