"""Qwen2-VL multi-axis RoPE (M-RoPE) positions of samples and packed rows (numpy).

The table follows transformers' ``get_rope_index`` for images, which Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3-VL-MoE, Qwen3.5 and Qwen3.5-MoE share (:data:`MROPE_MODEL_TYPES`); how a model then rotates by it
(Qwen2-VL's sectioned ``mrope_section``, Qwen3-VL's interleaved one) happens inside the model and needs
nothing here. :func:`mrope_model_config` is the one check that a model takes these tables; any other
model is refused by name for image rows.

A sample's table is int64 ``[3, L]`` (temporal, height, width); a packed row's is int64 ``[3, T]``,
restarting per segment, its padding counting on like ``position_ids`` (``packed-batch-spec.md``).
The row builder (:mod:`seqpack.packed.build`, :meth:`PackedSequence.from_boundaries`) attaches it as
``extra["mrope_position_ids"]`` whenever the segments' media carry a table or an ``image_grid_thw``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = [
    "MROPE_MODEL_TYPES",
    "mrope_model_config",
    "mrope_position_ids",
    "packed_mrope_position_ids",
    "with_segment_mrope",
    "mrope_from_image_tokens",
    "concat_mrope_tables",
]


#: transformers ``model_type`` s whose image rows take the tables of this module: their ``get_rope_index``
#: gives an image's tokens ``(start + t, start + h, start + w)`` over the merged grid and moves the text after
#: it to ``start + max(h, w) // merge`` (``transformers/models/{qwen2_vl,qwen2_5_vl,qwen3_vl,qwen3_5}/modeling_*.py``,
#: images only: their video positions differ from each other). Each is checked against its own forward in
#: ``tests/packed/test_vlm_families.py``. (Qwen3.5's linear-attention layers are a separate matter: they
#: carry state along the row, which the packing-support check refuses.)
MROPE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")


def mrope_model_config(config: Any) -> tuple[int, int]:
    """``(image_token_id, spatial_merge_size)`` of a model whose image rows seqpack runs exactly.

    Args:
        config: the model's config (``model.config``; read with ``getattr`` only).

    Returns:
        the config's ``image_token_id`` and ``vision_config.spatial_merge_size``.

    Raises:
        ValueError: ``config.model_type`` is not in :data:`MROPE_MODEL_TYPES` (a text-only model, or a
            vision-language model whose positions seqpack does not reproduce), or the config lacks the
            image token id / merge size; the message names the model type and what to do instead.
    """
    mt = getattr(config, "model_type", None)
    if mt not in MROPE_MODEL_TYPES:
        kind = ("has no vision tower" if getattr(config, "vision_config", None) is None else
                "computes its own image positions, which seqpack does not reproduce")
        raise ValueError(
            f"model_type {mt!r} {kind}: seqpack's image rows carry the M-RoPE positions of "
            f"{', '.join(MROPE_MODEL_TYPES)} (image tokens at their merged (t, h, w) grid, restarting per "
            "segment) and run exactly only on those models. Train image samples for this model unpacked "
            "(one sample per row, positions from its own processor), or pack text-only data")
    tok = getattr(config, "image_token_id", None)
    vc = getattr(config, "vision_config", None)
    merge = getattr(vc, "spatial_merge_size", None) if vc is not None else None
    if tok is None or not merge:
        raise ValueError(f"model_type {mt!r}: the config has no image_token_id ({tok!r}) or "
                         f"vision_config.spatial_merge_size ({merge!r}); load the model's full config")
    return int(tok), int(merge)


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


def with_segment_mrope(media: Sequence[dict | None], input_ids, cu_seqlens, cu_seqlens_padded, *,
                       image_pad_id: int, merge_size: int) -> list[dict | None]:
    """Per-segment media with ``mrope_position_ids`` int64 ``[3, L]`` computed for every segment that has
    an ``image_grid_thw`` but no table (new dicts; the others are returned as they are).

    Args:
        media: one entry per segment (``None`` for text segments).
        input_ids: int ``[T]`` the row's tokens; segment ``j``'s real tokens start at ``cu_seqlens_padded[j]``.
        cu_seqlens, cu_seqlens_padded: int ``[N+1]`` boundaries.
        image_pad_id: the ``<|image_pad|>`` token id; merge_size: the vision merge size.

    Raises:
        ValueError: a segment's image-token runs do not match its grids (from :func:`mrope_position_ids`).
    """
    cu = np.asarray(cu_seqlens, np.int64)
    cup = np.asarray(cu_seqlens_padded, np.int64)
    ids = np.asarray(input_ids)
    out: list[dict | None] = []
    for j, m in enumerate(media):
        if m and m.get("mrope_position_ids") is None and m.get("image_grid_thw") is not None:
            a = int(cup[j])
            seg = ids[a : a + int(cu[j + 1] - cu[j])]
            m = {**m, "mrope_position_ids": mrope_position_ids(seg, m["image_grid_thw"], int(merge_size),
                                                               int(image_pad_id))}
        out.append(m)
    return out


def mrope_from_image_tokens(input_ids, cu_seqlens, cu_seqlens_padded, image_grid_thw, *,
                            image_token_id: int, merge_size: int) -> np.ndarray | None:
    """The M-RoPE table int64 ``[3, T]`` of a row whose grids come as one ``[K, 3]`` array in segment order
    (a collated batch): each segment takes as many grids as it has image-token runs.

    Returns:
        the table, or ``None`` when no segment has an image.

    Raises:
        ValueError: the row's image-token runs and the number of grids differ.
    """
    ids = np.asarray(input_ids)
    cu = np.asarray(cu_seqlens, np.int64)
    cup = np.asarray(cu_seqlens_padded, np.int64)
    grid = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    media: list[dict | None] = []
    k = 0
    for j in range(len(cup) - 1):
        seg = ids[int(cup[j]) : int(cup[j]) + int(cu[j + 1] - cu[j])]
        is_img = seg == int(image_token_id)
        runs = int(is_img[0]) + int(np.count_nonzero(np.diff(is_img.astype(np.int8)) == 1)) if seg.size else 0
        media.append({"image_grid_thw": grid[k : k + runs]} if runs else None)
        k += runs
    if k != len(grid):
        raise ValueError(f"the row has {k} image-token runs (image_token_id={image_token_id}) but {len(grid)} "
                         "image grids in image_grid_thw")
    media = with_segment_mrope(media, ids, cu, cup, image_pad_id=image_token_id, merge_size=merge_size)
    return packed_mrope_position_ids(media, cu, cup)


def concat_mrope_tables(tables: Sequence[Any], position_ids: Sequence[np.ndarray]) -> np.ndarray | None:
    """Rows' M-RoPE tables laid end to end, int64 ``[3, sum T_i]``; ``None`` when no row has one.

    A row without a table (``None``, a text row) contributes its 1-D ``position_ids`` on all three axes.
    """
    if all(t is None for t in tables):
        return None
    parts = [np.broadcast_to(np.asarray(p, np.int64), (3, len(p))) if t is None else np.asarray(t, np.int64)
             for t, p in zip(tables, position_ids)]
    return np.concatenate(parts, axis=1)
