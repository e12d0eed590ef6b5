"""Image-text samples for Qwen2-VL / Qwen2.5-VL-style models: open images, expand placeholders.

A text-side :class:`~seqpack.data.sample.Sample` from :func:`seqpack.data.prepare` keeps each
``<image>`` placeholder as ordinary text tokens (which BPE may merge with neighbours: ``"?<"``,
``"><"``) and lists the resolved image paths in ``Sample.media["images"]``. This module turns it
into the sample the model trains on:

* every placeholder becomes ``<|vision_start|>`` + n x ``<|image_pad|>`` + ``<|vision_end|>`` with
  ``n = prod(image_grid_thw) // merge_size**2``, the number of image tokens the model's image
  processor implies (transformers' ``Qwen2VLImageProcessor``: patches of ``patch_size`` pixels,
  ``merge_size x merge_size`` patches merged into one token, as in the Qwen2-VL processor);
  already-expanded runs (``<|vision_start|><|image_pad|>...<|vision_end|>`` or bare
  ``<|image_pad|>`` runs) are re-expanded to the right count;
* ``Sample.media`` gets ``pixel_values`` (float32 ``[sum_i prod(grid_i), C*temporal_patch*patch^2]``)
  and ``image_grid_thw`` (int64 ``[num_images, 3]``) in placeholder order, next to ``images``;
* ``Sample.media["mrope_position_ids"]`` (int64 ``[3, L]``) holds the sample's multi-axis RoPE
  positions (temporal, height, width), computed per sample as transformers'
  ``Qwen2VLModel.get_rope_index`` does for one unpadded sequence, so that a packed row can carry
  per-segment positions (:func:`packed_mrope_position_ids`) instead of positions that run on
  across segment boundaries;
* labels stay shifted per sample (see :mod:`seqpack.data.sample`); image tokens are never targets;
* the packing cost is the expanded length (``Sample.length``), and the over-length policy acts on
  it: ``"drop"`` and ``"error"``, or ``"truncate"``, which cuts *before* a placeholder run that
  would not fit (never inside one) and removes the cut images' pixels with it.

Images are opened by content, not extension (real data has ``.jpg`` files that are PNG or WebP),
and converted to RGB (transparent pixels composited on white).

When a :class:`~seqpack.packed.PackedSequence` is built from such samples its ``media`` holds one
entry per segment in pack order; :func:`collate_media` concatenates them into the
``pixel_values`` / ``image_grid_thw`` pair a Qwen2-VL forward pass takes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from seqpack.data.sample import IGNORE_INDEX, PrepareReport, Sample, SampleRecord, shift_labels

__all__ = [
    "IMAGE_PLACEHOLDER",
    "VisionTokens",
    "open_image",
    "load_image_processor",
    "process_images",
    "num_image_tokens",
    "expand_image_placeholders",
    "expand_samples",
    "prepare_multimodal",
    "collate_media",
    "mrope_position_ids",
    "packed_mrope_position_ids",
    "OverlengthError",
]

logger = logging.getLogger(__name__)

IMAGE_PLACEHOLDER = "<image>"
OVERLENGTH_POLICIES = ("drop", "error", "truncate")


# ----------------------------------------------------------------------------------------------
# images
# ----------------------------------------------------------------------------------------------


def open_image(image: Any, *, background: tuple[int, int, int] = (255, 255, 255)):
    """Open an image by content and return it as an RGB ``PIL.Image.Image``.

    Args:
        image: a path (``str``/``Path``; the extension is ignored: PIL reads the header, so a
            ``.jpg`` that is really PNG or WebP opens fine), raw ``bytes``, a ``{"bytes", "path"}``
            dict (HF ``datasets`` Image column) or a PIL image.
        background: RGB colour that transparent pixels are composited onto (RGBA, LA, P with
            transparency); plain ``convert("RGB")`` would expose whatever colour hides under alpha 0.

    Returns:
        ``PIL.Image.Image`` in mode ``"RGB"``, fully loaded (the file is closed).

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: the content is not an image PIL can read (names the path and the format found).
    """
    import io

    from PIL import Image, UnidentifiedImageError

    name = "<image object>"
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            image, name = image["bytes"], str(image.get("path") or "<bytes>")
        elif image.get("path") is not None:
            image = image["path"]
    if isinstance(image, Image.Image):
        img = image
    else:
        if isinstance(image, (bytes, bytearray)):
            fh: Any = io.BytesIO(image)
            name = name if name != "<image object>" else "<bytes>"
        else:
            name = os.fspath(image)
            if not os.path.exists(name):
                raise FileNotFoundError(f"image file not found: {name}")
            fh = name
        try:
            img = Image.open(fh)
            img.load()
        except (UnidentifiedImageError, OSError) as e:
            raise ValueError(f"cannot read image {name}: {e}; the file is not an image format PIL supports") from e
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, background)
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    if img.mode != "RGB":
        return img.convert("RGB")
    return img


def load_image_processor(config: Any = None):
    """Build a Qwen2-VL image processor offline.

    Args:
        config: ``None`` for transformers' defaults (patch 14, merge 2, temporal patch 2, pixels in
            [3136, 1003520]); a dict of processor settings; or a path to a
            ``preprocessor_config.json`` (or a folder holding one), e.g. from a Qwen2.5-VL checkpoint.
            ``min_pixels``/``max_pixels`` are honoured. Nothing is downloaded.

    Returns:
        a transformers ``Qwen2VLImageProcessor`` (the PIL backend when torchvision is absent).

    Raises:
        FileNotFoundError: the path does not exist or the folder has no preprocessor_config.json.
    """
    cls = _processor_class()
    if config is None:
        return cls()
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / "preprocessor_config.json"
        if not path.is_file():
            raise FileNotFoundError(f"image processor config not found: {path} (expected preprocessor_config.json)")
        config = json.loads(path.read_text())
    if hasattr(config, "merge_size") and hasattr(config, "__call__"):
        return config  # already a processor
    drop = {"image_processor_type", "processor_class", "auto_map", "_processor_class"}
    return cls(**{k: v for k, v in dict(config).items() if k not in drop})


@lru_cache(maxsize=1)
def _processor_class():
    import importlib.util

    import transformers

    if importlib.util.find_spec("torchvision") is None and hasattr(transformers, "Qwen2VLImageProcessorPil"):
        return transformers.Qwen2VLImageProcessorPil
    return transformers.Qwen2VLImageProcessor


def process_images(images: Sequence[Any], image_processor) -> tuple[np.ndarray, np.ndarray]:
    """Run the image processor on a sample's images (opened with :func:`open_image`).

    Returns:
        ``(pixel_values, image_grid_thw)``: float32 ``[sum_i prod(grid_i), D]`` (``D = 3 *
        temporal_patch_size * patch_size**2``, rows in image order) and int64 ``[len(images), 3]``.
    """
    if len(images) == 0:
        return np.zeros((0, 0), np.float32), np.zeros((0, 3), np.int64)
    opened = [open_image(x) for x in images]
    out = image_processor(images=opened, return_tensors="np")
    pv = np.asarray(out["pixel_values"], dtype=np.float32)
    grid = np.asarray(out["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
    if grid.shape[0] != len(images) or pv.shape[0] != int(np.prod(grid, axis=1).sum()):
        raise RuntimeError(
            f"image processor returned {grid.shape[0]} grids / {pv.shape[0]} patch rows for {len(images)} images"
        )
    return pv, grid


def num_image_tokens(image_grid_thw: np.ndarray, merge_size: int) -> np.ndarray:
    """Image tokens per image: ``prod(grid_thw) // merge_size**2`` (Qwen2-VL's merger), int64 ``[k]``."""
    g = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    return np.prod(g, axis=1) // (int(merge_size) ** 2)


# ----------------------------------------------------------------------------------------------
# token bookkeeping
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionTokens:
    """Ids of the Qwen vision special tokens in a tokenizer (Qwen2/2.5-VL and Qwen3 share them)."""

    vision_start_id: int
    image_pad_id: int
    vision_end_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "VisionTokens":
        """Look the three tokens up; raises ``ValueError`` naming the missing ones."""
        names = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
        ids = [tokenizer.convert_tokens_to_ids(n) for n in names]
        unk = getattr(tokenizer, "unk_token_id", None)
        missing = [n for n, i in zip(names, ids) if i is None or (unk is not None and i == unk)]
        # a token that maps back to a different string is not really in the vocabulary
        missing += [n for n, i in zip(names, ids) if n not in missing and tokenizer.convert_ids_to_tokens(int(i)) != n]
        if missing:
            raise ValueError(
                f"tokenizer has no {missing} token(s); image placeholders need a Qwen2-VL-style tokenizer "
                "(e.g. load_tokenizer('qwen3'))"
            )
        return cls(*(int(i) for i in ids))


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-level BPE alphabet (byte -> printable unicode char), as used by Qwen tokenizers."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


class _TokenBytes:
    """Exact byte string of every token id (byte-level BPE), cached per tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.added = {int(i) for i in tokenizer.get_added_vocab().values()}
        self.cache: dict[int, bytes] = {}

    def __call__(self, ids: Iterable[int]) -> list[bytes]:
        out = []
        for i in ids:
            i = int(i)
            b = self.cache.get(i)
            if b is None:
                t = self.tok.convert_ids_to_tokens(i)
                if i in self.added or any(c not in _BYTE_DECODER for c in t):
                    b = t.encode("utf-8")
                else:
                    b = bytes(_BYTE_DECODER[c] for c in t)
                self.cache[i] = b
            out.append(b)
        return out


_TB_CACHE: dict[int, _TokenBytes] = {}


def _token_bytes(tokenizer) -> _TokenBytes:
    tb = _TB_CACHE.get(id(tokenizer))
    if tb is None or tb.tok is not tokenizer:
        tb = _TB_CACHE[id(tokenizer)] = _TokenBytes(tokenizer)
    return tb


class OverlengthError(ValueError):
    """An expanded image-text sample exceeds ``seq_length`` under ``overlength="error"``."""


_PH = object()  # marker for a placeholder inside a region


def _find_regions(ids: np.ndarray, tokenizer, vt: VisionTokens, placeholder: str):
    """Token regions [a, b) to rewrite, each with pieces (bytes text or _PH), sorted by position."""
    regions: list[tuple[int, int, list]] = []
    n = len(ids)
    # 1. special-token runs: <|vision_start|> <|image_pad|>* <|vision_end|>, or bare <|image_pad|> runs
    special = np.flatnonzero((ids == vt.vision_start_id) | (ids == vt.image_pad_id))
    covered = np.zeros(n, bool)
    for t in special.tolist():
        if covered[t]:
            continue
        a = t
        b = t + (1 if ids[t] == vt.vision_start_id else 0)
        while b < n and ids[b] == vt.image_pad_id:
            b += 1
        if ids[a] == vt.vision_start_id:
            if b >= n or ids[b] != vt.vision_end_id or b == a + 1:
                raise ValueError("a <|vision_start|> is not followed by <|image_pad|> tokens and <|vision_end|>")
            b += 1
        covered[a:b] = True
        regions.append((a, b, [_PH]))
    # 2. literal placeholder text (possibly merged into neighbouring tokens by BPE)
    pb = placeholder.encode("utf-8")
    toks = _token_bytes(tokenizer)(ids.tolist())
    text = b"".join(toks)
    if pb in text:
        ends = np.cumsum([len(x) for x in toks])
        starts = ends - np.asarray([len(x) for x in toks])
        occ = []
        pos = text.find(pb)
        while pos >= 0:
            occ.append(pos)
            pos = text.find(pb, pos + len(pb))
        i = 0
        while i < len(occ):
            a = int(np.searchsorted(ends, occ[i], side="right"))
            b = int(np.searchsorted(ends, occ[i] + len(pb) - 1, side="right")) + 1
            group = [occ[i]]
            # merge following occurrences whose tokens overlap this region (e.g. a "><" token)
            while i + 1 < len(occ) and int(np.searchsorted(ends, occ[i + 1], side="right")) < b:
                i += 1
                group.append(occ[i])
                b = int(np.searchsorted(ends, occ[i] + len(pb) - 1, side="right")) + 1
            if covered[a:b].any():
                raise ValueError("a literal image placeholder overlaps vision special tokens")
            pieces: list = []
            cur = int(starts[a])
            for o in group:
                pieces.append(text[cur:o])
                pieces.append(_PH)
                cur = o + len(pb)
            pieces.append(text[cur : int(ends[b - 1])])
            regions.append((a, b, [p for p in pieces if p is _PH or len(p)]))
            i += 1
    regions.sort(key=lambda r: r[0])
    return regions


def _record(sample: Sample, status: str, reason: str, detail: str, before=None, after=None) -> SampleRecord:
    return SampleRecord(sample.sample_id, sample.source, sample.index, status, reason, detail, before, after)


def expand_image_placeholders(
    sample: Sample,
    tokenizer,
    image_processor=None,
    *,
    images: Sequence[Any] | None = None,
    seq_length: int | None = None,
    overlength: str = "drop",
    placeholder: str = IMAGE_PLACEHOLDER,
) -> tuple[Sample | None, SampleRecord | None]:
    """Expand a sample's image placeholders to the model's image-token runs and attach pixels.

    Args:
        sample: text-side sample; placeholders are ``placeholder`` text (any BPE split) or Qwen
            vision special-token runs, one per image, in image order.
        tokenizer: a tokenizer with ``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>`` (the
            Qwen3 tokenizer has them); used to re-encode text that shared a token with a placeholder.
        image_processor: from :func:`load_image_processor` (``None`` = defaults).
        images: the images (paths, bytes, PIL); default ``sample.media["images"]``.
        seq_length: capacity in tokens for the over-length policy (``None`` = no limit).
        overlength: ``"drop"`` (returns ``None`` plus a record), ``"error"`` (raises), or
            ``"truncate"`` (cut at ``seq_length``, moved back to the start of a placeholder run that
            would be cut; images after the cut are removed; a sample left with no trained token is
            dropped).
        placeholder: the literal placeholder text.

    Returns:
        ``(sample, record)``: the expanded :class:`Sample` (``media`` = ``{"images",
        "pixel_values" float32 [P, D], "image_grid_thw" int64 [k, 3]}``; text-only samples are
        returned unchanged) or ``None`` when dropped; ``record`` is a
        :class:`~seqpack.data.sample.SampleRecord` for a dropped or truncated sample, else ``None``.

    Raises:
        ValueError: placeholder count != image count, unknown policy, over-length under
            ``"error"``, unreadable image (each names the sample id, source and index).
    """
    if overlength not in OVERLENGTH_POLICIES:
        raise ValueError(f"overlength must be one of {OVERLENGTH_POLICIES}, got {overlength!r}")
    where = f"sample {sample.sample_id!r} (source {sample.source}, index {sample.index})"
    media = dict(sample.media or {})
    imgs = list(images if images is not None else media.get("images") or [])
    vt = VisionTokens.from_tokenizer(tokenizer)
    ids = np.asarray(sample.input_ids, dtype=np.int64)
    try:
        regions = _find_regions(ids, tokenizer, vt, placeholder)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    n_ph = sum(p is _PH for _, _, pieces in regions for p in pieces)
    if n_ph != len(imgs):
        raise ValueError(
            f"{where}: {n_ph} image placeholder(s) but {len(imgs)} image(s); put exactly one {placeholder!r} "
            "in the text per image, in order"
        )
    if not imgs:
        return sample, None
    proc = image_processor if image_processor is not None else load_image_processor()
    try:
        pixel_values, grid = process_images(imgs, proc)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from e
    n_tok = num_image_tokens(grid, proc.merge_size)

    labels = np.asarray(sample.labels, dtype=np.int64)
    trainable = np.zeros(len(ids), bool)
    trainable[1:] = labels[:-1] != IGNORE_INDEX
    final_target = int(labels[-1]) if labels[-1] != IGNORE_INDEX else None

    new_ids: list[np.ndarray] = []
    new_tr: list[np.ndarray] = []
    run_spans: list[tuple[int, int]] = []  # [start, end) of each image run in the new ids
    out_len = 0
    cur = 0
    k = 0
    for a, b, pieces in regions:
        new_ids.append(ids[cur:a])
        new_tr.append(trainable[cur:a])
        out_len += a - cur
        text_tr = bool(trainable[a:b].any())
        for p in pieces:
            if p is _PH:
                run = np.concatenate(([vt.vision_start_id], np.full(int(n_tok[k]), vt.image_pad_id), [vt.vision_end_id]))
                new_ids.append(run.astype(np.int64))
                new_tr.append(np.zeros(len(run), bool))
                run_spans.append((out_len, out_len + len(run)))
                out_len += len(run)
                k += 1
            else:
                enc = np.asarray(tokenizer.encode(p.decode("utf-8", errors="replace"), add_special_tokens=False), np.int64)
                new_ids.append(enc)
                new_tr.append(np.full(len(enc), text_tr))
                out_len += len(enc)
        cur = b
    new_ids.append(ids[cur:])
    new_tr.append(trainable[cur:])
    out_ids = np.concatenate(new_ids)
    out_tr = np.concatenate(new_tr)
    out_labels = shift_labels(out_ids, out_tr, final_target)

    record = None
    meta = dict(sample.meta)
    if seq_length is not None and len(out_ids) > seq_length:
        detail = f"{len(out_ids)} tokens after expanding {len(imgs)} image(s) > seq_length {seq_length}"
        if overlength == "error":
            raise OverlengthError(
                f"{where}: {detail}; raise seq_length, lower the image processor's max_pixels, or use "
                "overlength='drop'|'truncate'"
            )
        if overlength == "drop":
            return None, _record(sample, "dropped", "overlength", detail, len(out_ids), None)
        cut = int(seq_length)
        for s, e in run_spans:
            if s < cut < e:
                cut = s
                break
        keep_imgs = sum(1 for s, _ in run_spans if s < cut)
        out_ids, out_labels = out_ids[:cut], out_labels[:cut]  # labels[cut-1] keeps its target (case B12)
        if cut == 0 or not np.any(out_labels != IGNORE_INDEX):
            return None, _record(
                sample, "dropped", "no_trainable_tokens", detail + f"; truncation at {cut} leaves no trained token",
                len(out_ids), cut,
            )
        rows = int(np.prod(grid[:keep_imgs], axis=1).sum())
        pixel_values, grid, imgs = pixel_values[:rows], grid[:keep_imgs], imgs[:keep_imgs]
        record = _record(
            sample, "truncated", "overlength",
            detail + f"; truncated to {cut} tokens before image run {keep_imgs}" if keep_imgs < len(run_spans)
            else detail + f"; truncated to {cut} tokens",
            int(np.concatenate(new_ids).shape[0]), cut,
        )
        meta["truncated"] = True
    media.update(
        images=imgs,
        pixel_values=pixel_values,
        image_grid_thw=grid,
        mrope_position_ids=mrope_position_ids(out_ids, grid, proc.merge_size, vt.image_pad_id),
    )
    meta["image_tokens"] = [int(x) for x in n_tok[: len(imgs)]]
    return (
        Sample(out_ids, out_labels, sample.sample_id, sample.source, sample.index, media=media, meta=meta),
        record,
    )


def expand_samples(
    samples: Iterable[Sample],
    tokenizer,
    image_processor=None,
    *,
    seq_length: int | None = None,
    overlength: str = "drop",
    on_error: str = "raise",
    report: PrepareReport | None = None,
) -> tuple[list[Sample], PrepareReport]:
    """:func:`expand_image_placeholders` over many samples, with accounting.

    Args:
        on_error: ``"raise"`` or ``"skip"`` (a bad sample, e.g. unreadable image or placeholder
            mismatch, is listed in the report with status ``"skipped"``).
        report: a report to extend (e.g. the one from ``seqpack.data.prepare``); a new one otherwise.

    Returns:
        ``(samples, report)``; every input is either returned or listed in ``report.entries``.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    rep = report if report is not None else PrepareReport()
    proc = image_processor if image_processor is not None else load_image_processor()
    out: list[Sample] = []
    fresh = report is None
    for s in samples:
        if fresh:
            rep.records_read += 1
        try:
            new, rec = expand_image_placeholders(s, tokenizer, proc, seq_length=seq_length, overlength=overlength)
        except OverlengthError:
            raise
        except ValueError as e:
            if on_error == "raise":
                raise
            rep.entries.append(_record(s, "skipped", "bad_media", str(e)))
            continue
        if rec is not None:
            rep.entries.append(rec)
            logger.warning("%s %s: %s", rec.status, rec.sample_id, rec.detail)
        if new is None:
            continue
        out.append(new)
    rep.samples_out = len(out)
    rep.tokens = int(sum(x.length for x in out))
    rep.trainable_tokens = int(sum(x.num_trainable for x in out))
    return out, rep


def prepare_multimodal(
    inputs: Any,
    tokenizer,
    *,
    seq_length: int,
    image_processor: Any = None,
    overlength: str = "drop",
    on_error: str = "raise",
    **prepare_kwargs: Any,
) -> tuple[list[Sample], PrepareReport]:
    """Tokenize image-text records and expand their images: ``seqpack.data.prepare`` + media step.

    The text side runs without a length limit (placeholders must be expanded before a cut can be
    placed safely); the over-length policy is then applied to the expanded length.

    Args:
        inputs: what :func:`seqpack.data.prepare` accepts (e.g. ``mllm_demo.json`` or the
            lmms-finetune JSON files; text-only records pass through unchanged).
        tokenizer: Qwen-style tokenizer (``load_tokenizer("qwen3")``).
        seq_length: capacity in tokens.
        image_processor: ``None``, a config dict/path, or a processor (:func:`load_image_processor`).
        overlength: ``"drop"`` | ``"error"`` | ``"truncate"`` (never inside an image run).
        on_error: ``"raise"`` | ``"skip"`` for bad records and bad images.
        prepare_kwargs: passed to ``prepare`` (``train_on``, ``format``, ``progress``).

    Returns:
        ``(samples, report)`` as from ``prepare``; the report also lists media drops/truncations.
    """
    from seqpack.data import prepare

    proc = load_image_processor(image_processor)
    samples, report = prepare(
        inputs, tokenizer, seq_length=2**31 - 1, overlength="error", on_error=on_error, **prepare_kwargs
    )
    out, report = expand_samples(
        samples, tokenizer, proc, seq_length=seq_length, overlength=overlength, on_error=on_error, report=report
    )
    return out, report


def collate_media(media: Sequence[dict | None] | None) -> dict[str, np.ndarray] | None:
    """Concatenate per-segment media (``PackedSequence.media``) into one model input, pack order.

    Returns:
        ``{"pixel_values": float32 [P, D], "image_grid_thw": int64 [K, 3]}`` where image ``j``'s
        patch rows follow image ``j-1``'s, matching the order of the image-token runs in
        ``input_ids``; ``None`` when no segment has images.
    """
    if not media:
        return None
    with_images = [m for m in media if m and m.get("image_grid_thw") is not None and len(m["image_grid_thw"])]
    if not with_images:
        return None
    missing = [i for i, m in enumerate(with_images) if m.get("pixel_values") is None]
    if missing:
        raise ValueError(
            f"{len(missing)} segment(s) with images carry image_grid_thw but no pixel_values (e.g. images "
            f"{with_images[missing[0]].get('images')}). Offline packs store image paths, not pixels: open the "
            "dataset with seqpack.io.load_packed(path, load_media=True) so pixel_values are recomputed."
        )
    pv = [m["pixel_values"] for m in with_images]
    grids = [m["image_grid_thw"] for m in with_images]
    return {
        "pixel_values": np.concatenate([np.asarray(x, np.float32) for x in pv]),
        "image_grid_thw": np.concatenate([np.asarray(g, np.int64).reshape(-1, 3) for g in grids]),
    }


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
