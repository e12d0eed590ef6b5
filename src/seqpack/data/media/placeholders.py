"""Expand a sample's image placeholders to the model's image-token runs (``<|vision_start|>`` + n x
``<|image_pad|>`` + ``<|vision_end|>``, n = prod(image_grid_thw) // merge_size**2) and attach pixels,
M-RoPE positions and the over-length policy (``seqpack.data.length_policy.image_cut``).

Labels stay shifted per sample (``seqpack.sample``); image tokens are never targets. The whole
picture (BPE-merged placeholders, already-expanded runs, pixels, positions): ``docs/notes/media.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqpack.data.length_policy import check_overlength, image_cut, trainable_mask
from seqpack.data.media.images import ImageError, load_image_processor, num_image_tokens, process_images
from seqpack.packed.mrope import mrope_position_ids
from seqpack.data.records import IMAGE_PLACEHOLDER
from seqpack.sample import IGNORE_INDEX, Sample, shift_labels
from seqpack.accounting import SampleRecord

__all__ = ["VisionTokens", "expand_image_placeholders"]


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


def sample_where(sample: Sample) -> str:
    """Where a sample came from, in the words :class:`~seqpack.data.records.DataFormatError` uses for a
    record: ``"FILE, line N"`` for a JSONL record (its index is line - 1, ``seqpack.data.sources``), else
    ``"FILE, record N"``, then the sample id: ``"data.jsonl, line 3 (sample 'data.jsonl:2')"``."""
    source, index = sample.source, sample.index
    if isinstance(index, int) and str(source).lower().endswith((".jsonl", ".ndjson")):
        pos = f"line {index + 1}"
    else:
        pos = f"record {index}"
    return f"{source or '<input>'}, {pos} (sample {sample.sample_id!r})"


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
        overlength: one of ``seqpack.data.length_policy.OVERLENGTH_POLICIES`` (default ``"drop"``, see
            that module): ``"drop"`` (returns ``None`` plus a record), ``"error"`` (raises
            ``OverlengthError``), ``"split"`` (drops: an image sample cannot be split; reason
            ``"overlength_media"``), or ``"truncate"`` (cut at ``seq_length``, moved back to the start of
            a placeholder run that would be cut; images after the cut are removed; a sample left with no
            trained token is dropped).
        placeholder: the literal placeholder text.

    Returns:
        ``(sample, record)``: the expanded :class:`Sample` (``media`` = ``{"images",
        "pixel_values" float32 [P, D], "image_grid_thw" int64 [k, 3]}``; text-only samples are
        returned unchanged) or ``None`` when dropped; ``record`` is a
        :class:`~seqpack.accounting.SampleRecord` for a dropped or truncated sample, else ``None``.

    Raises:
        ValueError: placeholder count != image count, unknown policy, over-length under
            ``"error"``; ``ImageError`` (a ``ValueError`` with ``reason``) for a missing, unreadable or
            too large image (each names the sample id, source and index).
    """
    check_overlength(overlength)
    where = sample_where(sample)
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
        raise ImageError(f"{where}: {e}", getattr(e, "reason", "bad_media")) from e
    n_tok = num_image_tokens(grid, proc.merge_size)

    labels = np.asarray(sample.labels, dtype=np.int64)
    trainable = trainable_mask(labels)
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
    cut, reason, detail = image_cut(
        len(out_ids), run_spans, seq_length=seq_length, overlength=overlength, where=where, num_images=len(imgs)
    )
    if cut is None:
        return None, _record(sample, "dropped", reason, detail, len(out_ids), None)
    if cut < len(out_ids):
        keep_imgs = sum(1 for s, _ in run_spans if s < cut)
        before = len(out_ids)
        out_ids, out_labels = out_ids[:cut], out_labels[:cut]  # labels[cut-1] keeps its target (case B12)
        if cut == 0 or not np.any(out_labels != IGNORE_INDEX):
            return None, _record(
                sample, "dropped", "no_trainable_tokens", detail + f"; truncation at {cut} leaves no trained token",
                before, cut,
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
