"""The torch data path: datasets and collators that turn samples or packs into training batches.

Four pieces, all top-level and picklable (``DataLoader(num_workers>0)`` works), all usable as the
``data_collator`` of ``transformers.Trainer``:

- :class:`PackedDataset` -- map-style dataset over an offline packed directory (``seqpack.io``) or
  any sequence of ``PackedSequence``.
- :class:`PaddedCollator` -- the unpacked baseline: right-padded ``[B, S]`` rows (for comparisons).
- :class:`PackedCollator` -- offline packs -> one THD row; ``B`` packs are flattened into ``[1, sum T]``
  with **offset** boundaries (row ``i``'s logical ``cu_seqlens`` shifted by the real-token counts of
  rows ``< i``, its ``cu_seqlens_padded`` by their widths; never row 0's boundaries reused).
- :class:`InBatchPackingCollator` -- packs a micro-batch of unpacked ``Sample`` s at collate time
  (Megatron-Bridge's VLM in-batch packing).

Output formats (``format=``):

``"thd"`` (default)
    The canonical batch dict of ``seqpack.adapters._batch``: ``input_ids, labels (shifted per
    segment), loss_mask, position_ids, padding_mask, seq_idx`` as ``[1, T]``; ``cu_seqlens,
    cu_seqlens_padded`` int32 ``[N+1]``; ``max_seqlen, num_segments`` ints; ``seq_lens``; and
    ``sample_ids`` (list of str). Feed it to ``seqpack.hf.packed_forward``, ``seqpack.adapters.*``,
    ``seqpack.loss``. Image rows add ``pixel_values``, ``image_grid_thw`` (segment order) and
    ``mrope_position_ids`` int64 ``[3, T]`` (Qwen2-VL M-RoPE, restarting per segment).
``"hf"``
    Exactly the keyword arguments an HF causal LM's ``forward`` takes, so ``Trainer`` can call
    ``model(**batch)`` (Trainer removes unused *dataset columns* only, never collator keys):
    ``input_ids``, ``position_ids``, ``labels`` (HF unshifted: -100 at every segment start),
    ``shift_labels`` (our shifted labels; HF's ``ForCausalLMLoss`` uses them as given, and Trainer
    counts ``num_items_in_batch`` from them), plus the attention inputs for
    ``attn_implementation`` (image rows: ``position_ids`` is the M-RoPE table ``[3, 1, T]``, plus
    ``pixel_values``/``image_grid_thw``): ``"sdpa"`` -> 4-D bool ``attention_mask`` ``[1,1,T,T]``;
    ``"eager"`` -> 4-D additive float mask; ``"flex_attention"`` -> a FlexAttention ``BlockMask``;
    ``"flash_attention_2"/"flash_attention_3"`` -> ``cu_seq_lens_q/k`` + ``max_length_q/k`` and no
    mask. A 4-D mask costs ``T*T`` bytes (bool) or ``4*T*T`` (fp32): prefer flash-attn for long rows.
``"megatron"``
    ``seqpack.adapters.to_megatron`` of the row: ``tokens, labels, loss_mask, position_ids,
    padding_mask`` ``[1, T]`` and ``packed_seq_params`` (the ``PackedSeqParams`` fields as a dict);
    image rows also carry ``pixel_values``, ``image_grid_thw`` and ``mrope_position_ids`` ``[3, T]``.

Tail padding, two layouts (see ``packed-batch-spec.md``):

- offline rows (``build_packed_sequence(pad_to_max_length=True)``): the **last segment absorbs the
  tail**: ``cu_seqlens_padded[-1] == T`` and the tail slots belong to segment N-1 (positions keep
  counting), ``N+1`` boundary entries.
- :class:`InBatchPackingCollator` with ``force_to_pad_to_seq_len=True`` (Megatron-Bridge VLM
  layout): the tail becomes its **own empty segment** in ``cu_seqlens_padded``
  (``[..., sum_padded, seq_length]``) while ``cu_seqlens`` repeats its last value (logical length 0),
  so varlen attention treats the tail as a separate sequence that no real token sees and the
  logical lengths never count it. ``num_segments`` is then ``N+1`` (the tail is segment ``N``, all
  padding; it has no loss tokens, so sequence-mean losses skip it).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from seqpack.packed import IGNORE_INDEX, _segment_fields, trim_cu_seqlens
from seqpack.padding import check_seq_length, round_up

FORMATS = ("thd", "hf", "megatron")
HF_ATTN = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")

__all__ = [
    "PackedDataset",
    "PaddedCollator",
    "PackedCollator",
    "InBatchPackingCollator",
    "to_hf_inputs",
]


# --------------------------------------------------------------------------- dataset
class PackedDataset(torch.utils.data.Dataset):
    """Map-style dataset of packed rows: ``ds[i]`` is a ``PackedSequence``.

    Args:
        source: a packed dataset directory (opened with ``seqpack.io.load_packed(source, expect)``)
            or any sequence of ``PackedSequence`` (e.g. a list, or an already opened dataset).
        expect: settings checked against the directory's metadata (see ``load_packed``).

    Picklable when ``source`` is: for a directory only the path is pickled and workers reopen it.
    """

    def __init__(self, source: Any, expect: Mapping[str, Any] | None = None):
        self._path = None
        self._expect = dict(expect) if expect else None
        if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
            self._path = str(source)
            self._rows = None
        else:
            if not hasattr(source, "__getitem__") or not hasattr(source, "__len__"):
                raise TypeError(f"PackedDataset needs a directory or a sequence of PackedSequence, got {type(source)!r}")
            self._rows = source

    def _open(self):
        if self._rows is None:
            from seqpack.io import load_packed

            self._rows = load_packed(self._path, self._expect)
        return self._rows

    def __len__(self) -> int:
        return len(self._open())

    def __getitem__(self, i: int):
        return self._open()[i]

    def __getstate__(self):
        state = dict(self.__dict__)
        if self._path is not None:
            state["_rows"] = None  # reopen (memory map) in the worker
        return state


# --------------------------------------------------------------------------- helpers
def _get(obj: Any, key: str, default=None):
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _np(x, dtype):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype).reshape(-1)


def _check_format(fmt: str, attn_implementation: str | None) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "hf" and attn_implementation not in HF_ATTN:
        raise ValueError(
            f"format='hf' needs attn_implementation in {HF_ATTN} (the mask kind depends on it), got "
            f"{attn_implementation!r}; pass attn_implementation=model.config._attn_implementation"
        )


def _sample_arrays(feature: Any, label_convention: str, index: int):
    ids = _get(feature, "input_ids")
    lab = _get(feature, "labels")
    sid = _get(feature, "sample_id", None)
    sid = str(sid) if sid is not None else str(index)
    if ids is None:
        raise KeyError(f"feature {index} (sample {sid!r}) has no 'input_ids'")
    ids = _np(ids, np.int64)
    if ids.size == 0:
        raise ValueError(f"feature {index} (sample {sid!r}) is empty; empty segments never reach a kernel")
    if lab is None:
        lab = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
        if ids.size > 1:
            lab[:-1] = ids[1:]
    else:
        lab = _np(lab, np.int64)
        if lab.shape != ids.shape:
            raise ValueError(f"feature {index} (sample {sid!r}): labels {lab.shape} vs input_ids {ids.shape}")
        if label_convention == "hf":
            shifted = np.full_like(lab, IGNORE_INDEX)
            shifted[:-1] = lab[1:]
            lab = shifted
    return ids, lab, sid


def _assemble_row(
    ids_list: Sequence[np.ndarray],
    lab_list: Sequence[np.ndarray],
    *,
    multiple: int,
    pad_token_id: int,
    seq_length: int | None,
    force_to_pad_to_seq_len: bool,
    sample_ids: Sequence[str],
) -> dict[str, Any]:
    lens = np.fromiter((a.shape[0] for a in ids_list), dtype=np.int64, count=len(ids_list))
    padded = round_up(lens, multiple) if multiple > 1 else lens.copy()
    total = int(padded.sum())
    if seq_length is not None and total > seq_length:
        detail = ", ".join(f"{s}:{int(l)}->{int(p)}" for s, l, p in zip(sample_ids, lens, padded))
        raise ValueError(
            f"in-batch pack of {len(ids_list)} samples needs {total} slots (each padded to a multiple of "
            f"{multiple}) > seq_length={seq_length} (sample_id:length->padded: {detail}); lower the micro-batch "
            "size, raise seq_length, or pack offline with seqpack.algorithms.pack_lengths"
        )
    n = len(ids_list)
    cu = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    cup = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(padded, out=cup[1:])
    T = total
    seg_len = padded
    real_len = lens
    if force_to_pad_to_seq_len and seq_length is not None and seq_length > total:
        T = int(seq_length)
        cu = np.append(cu, cu[-1])
        cup = np.append(cup, T)
        seg_len = np.append(padded, T - total)
        real_len = np.append(lens, 0)
    input_ids = np.full(T, pad_token_id, dtype=np.int64)
    labels = np.full(T, IGNORE_INDEX, dtype=np.int64)
    if multiple == 1 and T == total:
        input_ids = np.concatenate(ids_list)
        labels = np.concatenate(lab_list)
    else:
        for a, x, y in zip(cup[:-1].tolist(), ids_list, lab_list):
            input_ids[a : a + x.shape[0]] = x
            labels[a : a + y.shape[0]] = y
    return _finish(input_ids, labels, cu, cup, seg_len, real_len, list(sample_ids))


def _finish(input_ids, labels, cu, cup, seg_len, real_len, sample_ids) -> dict[str, Any]:
    n = cu.shape[0] - 1
    position_ids, padding_mask, seq_idx = _segment_fields(cup, real_len)
    lab_t = torch.from_numpy(labels)
    return {
        "input_ids": torch.from_numpy(input_ids).unsqueeze(0),
        "labels": lab_t.unsqueeze(0),
        "loss_mask": (lab_t != IGNORE_INDEX).unsqueeze(0),
        "position_ids": torch.from_numpy(position_ids).unsqueeze(0),
        "padding_mask": torch.from_numpy(padding_mask).unsqueeze(0),
        "seq_idx": torch.from_numpy(seq_idx).unsqueeze(0),
        "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
        "cu_seqlens_padded": torch.from_numpy(cup.astype(np.int32)),
        "seq_lens": torch.from_numpy(np.diff(cu).astype(np.int32)),
        "max_seqlen": int(seg_len.max()),
        "num_segments": int(n),
        "sample_ids": sample_ids,
    }


def to_hf_inputs(batch: Mapping[str, Any], attn_implementation: str, *, mask_dtype=None,
                 device=None, image_token_id: int | None = None,
                 spatial_merge_size: int | None = None) -> dict[str, Any]:
    """Turn a canonical THD batch into the exact keyword arguments of an HF causal LM's ``forward``.

    Args:
        batch: canonical batch dict (``format="thd"`` output, ``PackedSequence.to_torch()``,
            or ``seqpack.adapters.as_batch(...)``); one row.
        attn_implementation: ``model.config._attn_implementation`` (one of ``HF_ATTN``).
        mask_dtype: dtype of the additive mask for ``eager`` (default float32).
        device: build masks on this device (default: where ``input_ids`` is).
        image_token_id, spatial_merge_size: the model's ``<|image_pad|>`` id and vision merge size
            (``config.image_token_id``, ``config.vision_config.spatial_merge_size``); only used to
            compute M-RoPE positions for a batch with ``image_grid_thw`` but no
            ``mrope_position_ids`` (``seqpack.hf.packed_forward`` passes them from the config).

    Returns:
        dict with ``input_ids, position_ids, labels (HF unshifted), shift_labels`` ``[1, T]`` and the
        attention inputs described in the module docstring. Image rows (the batch carries
        ``mrope_position_ids`` int64 ``[3, T]``, or ``image_grid_thw``) get ``position_ids`` of shape
        ``[3, 1, T]``: Qwen2-VL M-RoPE positions restarting per segment
        (``seqpack.data.media.packed_mrope_position_ids``). A ``[1, T]`` ``position_ids`` would make
        HF Qwen2-VL skip its own ``get_rope_index`` and rotate image tokens with text positions.

    Raises:
        ValueError: unknown ``attn_implementation``; a batch with ``image_grid_thw`` but neither
            ``mrope_position_ids`` nor ``image_token_id``/``spatial_merge_size`` to compute them.
    """
    from seqpack.adapters import _batch, attention
    from seqpack.adapters.labels import hf_unshifted_labels

    _check_format("hf", attn_implementation)
    b = _batch.as_batch(batch)
    dev = device if device is not None else b["input_ids"].device
    out: dict[str, Any] = {
        "input_ids": b["input_ids"].to(dev),
        "position_ids": b["position_ids"].to(dev),
    }
    mrope = _batch_mrope(batch, b, image_token_id, spatial_merge_size)
    if mrope is not None:
        out["position_ids"] = mrope[:, None, :].to(dev)  # [3, 1, T], Qwen2-VL's (axes, batch, T)
    if "labels" in b:
        lab = b["labels"]
        cup = b["cu_seqlens_padded"]
        # an explicit final target at a segment's last physical slot has no HF slot; it stays in shift_labels
        safe = lab.clone()
        safe[..., (cup[1:] - 1).long()] = IGNORE_INDEX
        out["labels"] = hf_unshifted_labels(safe, cup).to(dev)
        out["shift_labels"] = lab.to(dev)
    if attn_implementation == "sdpa":
        out["attention_mask"] = attention.dense_block_causal_mask(
            b["seq_idx"].to(dev), b["padding_mask"].to(dev))[None, None]
    elif attn_implementation == "eager":
        dtype = mask_dtype or torch.float32
        allowed = attention.dense_block_causal_mask(b["seq_idx"].to(dev), b["padding_mask"].to(dev))[None, None]
        out["attention_mask"] = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(
            ~allowed, torch.finfo(dtype).min)
    elif attn_implementation == "flex_attention":
        out["attention_mask"] = attention.flex_block_mask(b, device=dev)
    else:  # flash_attention_2 / flash_attention_3: varlen kwargs, no mask
        fk = attention.flash_attn_kwargs(b)
        out.update({k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in fk.items()})
    for k in MEDIA_KEYS:  # VLM inputs travel as they are (segment order)
        if batch.get(k) is not None:
            out[k] = batch[k].to(dev) if isinstance(batch[k], torch.Tensor) else batch[k]
    return out


MEDIA_KEYS = ("pixel_values", "image_grid_thw")


def _batch_mrope(batch: Mapping[str, Any], b: Mapping[str, Any], image_token_id, merge) -> torch.Tensor | None:
    """M-RoPE table int64 ``[3, T]`` of a one-row batch, or None for a text row."""
    m = batch.get("mrope_position_ids")
    T = int(b["input_ids"].shape[-1])
    if m is not None:
        m = torch.as_tensor(m).to(torch.int64)
        if m.dim() == 3:
            m = m.reshape(m.shape[0], -1)
        if m.shape != (3, T):
            raise ValueError(f"mrope_position_ids has shape {tuple(m.shape)}, expected (3, {T}) (one THD row)")
        return m
    grid = batch.get("image_grid_thw")
    if grid is None or len(grid) == 0:
        return None
    if image_token_id is None or not merge:
        raise ValueError(
            "the batch has image_grid_thw but no mrope_position_ids, so image tokens would get text positions; "
            "build samples with seqpack.data.media.prepare_multimodal / open packs with seqpack.io.load_packed "
            "(both store mrope_position_ids), or pass image_token_id= and spatial_merge_size= "
            "(seqpack.hf.packed_forward takes them from the model config)")
    from seqpack.data.media import mrope_position_ids, packed_mrope_position_ids

    ids = b["input_ids"][0].detach().cpu().numpy()
    cu = b["cu_seqlens"].cpu().numpy().astype(np.int64)
    cup = b["cu_seqlens_padded"].cpu().numpy().astype(np.int64)
    grid = np.asarray(torch.as_tensor(grid).cpu().numpy(), np.int64).reshape(-1, 3)
    media, k = [], 0
    for j in range(len(cup) - 1):
        seg = ids[int(cup[j]) : int(cup[j]) + int(cu[j + 1] - cu[j])]
        is_img = seg == int(image_token_id)
        runs = int(is_img[0]) + int(np.count_nonzero(np.diff(is_img.astype(np.int8)) == 1)) if seg.size else 0
        if runs == 0:
            media.append(None)
            continue
        media.append({"mrope_position_ids": mrope_position_ids(seg, grid[k : k + runs], int(merge), int(image_token_id))})
        k += runs
    if k != len(grid):
        raise ValueError(f"the row has {k} image-token runs (image_token_id={image_token_id}) but {len(grid)} "
                         "image grids in image_grid_thw")
    table = packed_mrope_position_ids(media, cu, cup)
    return None if table is None else torch.from_numpy(table)


def _add_media(batch: dict[str, Any], media: Sequence[Any]) -> None:
    """Concatenate per-segment media in segment order (``seqpack.data.media.collate_media``)."""
    if not any(m for m in media):
        return
    from seqpack.data.media import collate_media

    cm = collate_media(list(media))
    if cm:
        for k, v in cm.items():
            batch[k] = torch.from_numpy(np.ascontiguousarray(v))


def _format(batch: dict[str, Any], fmt: str, attn_implementation: str | None, mask_dtype) -> dict[str, Any]:
    if fmt == "thd":
        return batch
    if fmt == "megatron":
        from seqpack.adapters import to_megatron

        out = to_megatron(batch)
        for k in (*MEDIA_KEYS, "mrope_position_ids"):
            if k in batch:
                out[k] = batch[k]
        return out
    return to_hf_inputs(batch, attn_implementation, mask_dtype=mask_dtype)


# --------------------------------------------------------------------------- collators
class PaddedCollator:
    """The unpacked baseline: right-pad each sample to the longest in the batch (``[B, S]``).

    Args:
        pad_token_id: id written into padding slots.
        pad_to_multiple_of: round ``S`` up to this multiple (>= 1).
        format: ``"hf"`` -> ``input_ids, attention_mask (1 = real), labels (HF unshifted)`` and, when
            ``shift_labels=True``, ``shift_labels`` (our shifted labels, keeps explicit final targets);
            ``"shifted"`` -> ``input_ids, attention_mask, labels (shifted), loss_mask, position_ids``.
        label_convention: convention of the incoming ``labels``: ``"shifted"`` (``Sample``) or ``"hf"``.
        shift_labels: also emit ``shift_labels`` in ``format="hf"``.

    Features are ``Sample`` objects or mappings with ``input_ids`` (and optionally ``labels``,
    ``sample_id``); missing labels mean "train on every next token".

    Returns (``__call__``):
        dict of tensors; int64 ``[B, S]`` for ids/labels/mask, bool ``loss_mask``.
    """

    def __init__(self, pad_token_id: int, *, pad_to_multiple_of: int = 1, format: str = "hf",
                 label_convention: str = "shifted", shift_labels: bool = True):
        if format not in ("hf", "shifted"):
            raise ValueError(f"PaddedCollator format must be 'hf' or 'shifted', got {format!r}")
        if label_convention not in ("shifted", "hf"):
            raise ValueError(f"label_convention must be 'shifted' or 'hf', got {label_convention!r}")
        if int(pad_to_multiple_of) < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        self.format = format
        self.label_convention = label_convention
        self.shift_labels = shift_labels

    def __call__(self, features: Sequence[Any]) -> dict[str, torch.Tensor]:
        if len(features) == 0:
            raise ValueError("PaddedCollator got an empty batch")
        rows = [_sample_arrays(f, self.label_convention, i) for i, f in enumerate(features)]
        S = round_up(max(r[0].shape[0] for r in rows), self.pad_to_multiple_of)
        B = len(rows)
        ids = np.full((B, S), self.pad_token_id, dtype=np.int64)
        lab = np.full((B, S), IGNORE_INDEX, dtype=np.int64)
        att = np.zeros((B, S), dtype=np.int64)
        for i, (x, y, _) in enumerate(rows):
            ids[i, : x.shape[0]] = x
            lab[i, : y.shape[0]] = y
            att[i, : x.shape[0]] = 1
        out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(att)}
        labels = torch.from_numpy(lab)
        if self.format == "shifted":
            out["labels"] = labels
            out["loss_mask"] = labels != IGNORE_INDEX
            out["position_ids"] = torch.arange(S).unsqueeze(0).expand(B, S).clone()
            return out
        hf = torch.full_like(labels, IGNORE_INDEX)
        hf[:, 1:] = labels[:, :-1]
        out["labels"] = hf
        if self.shift_labels:
            out["shift_labels"] = labels
        return out


class PackedCollator:
    """Collate offline packs (``PackedSequence`` rows) into ONE THD row.

    With micro-batch size 1 the row is the pack itself. With ``B > 1`` packs the per-token fields
    are concatenated; ``cu_seqlens_padded`` of row ``i`` is offset by the widths of the rows before
    it (``+ sum(T_j, j < i)``) and the logical ``cu_seqlens`` by their real-token counts
    (``+ sum(cu_seqlens_j[-1], j < i)``), so every segment keeps its real length
    ``cu[s+1] - cu[s]`` at slot offset ``cup[s]`` (Transformer Engine THD-with-padding semantics)
    and the flattened row has ``sum(N_i)`` segments; static-shape padded boundary arrays (B19) are
    trimmed to each row's true ``num_segments`` first.

    Image rows: the rows' M-RoPE tables (``PackedSequence.extra["mrope_position_ids"]``, a mapping's
    ``mrope_position_ids``, or built from the segments' ``media["mrope_position_ids"]``) are
    concatenated into ``batch["mrope_position_ids"]`` int64 ``[3, T]`` (text rows: their 1-D
    positions on all axes); ``format="hf"`` sends it as ``position_ids`` ``[3, 1, T]``.

    Args:
        format: ``"thd"``, ``"hf"`` or ``"megatron"`` (module docstring).
        attn_implementation: required for ``format="hf"``.
        mask_dtype: dtype of the eager additive mask.

    Features: ``PackedSequence`` objects or mappings with ``input_ids``, ``labels``, ``cu_seqlens``,
    ``cu_seqlens_padded`` (optionally ``num_segments``, ``sample_ids``).

    Raises:
        KeyError: a feature lacks boundary arrays.
    """

    def __init__(self, *, format: str = "thd", attn_implementation: str | None = None, mask_dtype=None):
        _check_format(format, attn_implementation)
        self.format = format
        self.attn_implementation = attn_implementation
        self.mask_dtype = mask_dtype

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        if len(features) == 0:
            raise ValueError("PackedCollator got an empty batch")
        ids_l, lab_l, cu_l, cup_l, sids, media, mropes = [], [], [], [], [], [], []
        log_off = 0  # real tokens of the rows before: offsets the LOGICAL boundaries
        off = 0  # slots of the rows before: offsets the PHYSICAL boundaries
        for i, f in enumerate(features):
            cu = _get(f, "cu_seqlens")
            cup = _get(f, "cu_seqlens_padded")
            if cu is None or cup is None:
                raise KeyError(f"pack {i} has no cu_seqlens/cu_seqlens_padded; PackedCollator needs the boundaries")
            # static-shape boundary arrays (B19): trim by the carried N, else let the padded array decide
            cup = trim_cu_seqlens(_np(cup, np.int64), _get(f, "num_segments", None) or None).astype(np.int64)
            cu = trim_cu_seqlens(_np(cu, np.int64), cup.shape[0] - 1).astype(np.int64)
            ids = _np(_get(f, "input_ids"), np.int64)
            lab = _np(_get(f, "labels"), np.int64)
            if ids.shape[0] != int(cup[-1]):
                raise ValueError(f"pack {i}: {ids.shape[0]} slots but cu_seqlens_padded[-1] = {int(cup[-1])}")
            ids_l.append(ids)
            lab_l.append(lab)
            if int(cu[0]) != 0 or int(cup[0]) != 0:
                raise ValueError(f"pack {i}: boundary arrays must start at 0, got cu_seqlens[0]={int(cu[0])}, "
                                 f"cu_seqlens_padded[0]={int(cup[0])}")
            # logical boundaries count real tokens only: row i's cu_seqlens shift by the real tokens of
            # rows < i, its cu_seqlens_padded by their slots, so segment s keeps real length
            # cu[s+1]-cu[s] at slot offset cup[s] (Transformer Engine THD with padding)
            cu_l.append(cu[1:] + log_off if cu_l else cu + log_off)
            cup_l.append(cup[1:] + off if cup_l else cup + off)
            s = _get(f, "sample_ids", None)
            sids.extend(list(s) if s is not None else [f"{i}:{j}" for j in range(cu.shape[0] - 1)])
            m = _get(f, "media", None)
            seg_media = list(m) if m is not None else [None] * (cu.shape[0] - 1)
            media.extend(seg_media)
            mropes.append(_row_mrope(f, seg_media, cu, cup, i))
            log_off += int(cu[-1])
            off += ids.shape[0]
        cu = np.concatenate(cu_l)
        cup = np.concatenate(cup_l)
        seg_len = np.diff(cup)
        real_len = np.diff(cu)
        input_ids = np.concatenate(ids_l) if len(ids_l) > 1 else ids_l[0].copy()
        labels = np.concatenate(lab_l) if len(lab_l) > 1 else lab_l[0].copy()
        batch = _finish(input_ids, labels, cu, cup, seg_len, real_len, sids)
        if any(m is not None for m in mropes):
            # rows without a table keep 1-D positions on all three axes (text-only rows)
            full = batch["position_ids"][0].expand(3, -1).clone()
            start = 0
            for m, w in zip(mropes, (x.shape[0] for x in ids_l)):
                if m is not None:
                    full[:, start : start + w] = torch.as_tensor(np.asarray(m, dtype=np.int64))
                start += w
            batch["mrope_position_ids"] = full
        _add_media(batch, media)
        return _format(batch, self.format, self.attn_implementation, self.mask_dtype)


def _row_mrope(f: Any, seg_media: Sequence[Any], cu: np.ndarray, cup: np.ndarray, index: int):
    """The row's M-RoPE table int64 ``[3, T_row]`` or None: ``extra["mrope_position_ids"]`` of a
    ``PackedSequence``, a mapping's ``mrope_position_ids``, else built from the segments' media."""
    m = _get(f, "mrope_position_ids", None)
    if m is None:
        extra = getattr(f, "extra", None)
        if isinstance(extra, Mapping):
            m = extra.get("mrope_position_ids")
    if m is None and any(x for x in seg_media):
        from seqpack.data.media import packed_mrope_position_ids

        m = packed_mrope_position_ids(seg_media, cu, cup)
    if m is None:
        return None
    m = m.detach().cpu().numpy() if isinstance(m, torch.Tensor) else np.asarray(m)
    m = m.reshape(3, -1) if m.ndim == 3 else m
    if m.shape != (3, int(cup[-1])):
        raise ValueError(f"pack {index}: mrope_position_ids has shape {m.shape}, expected (3, {int(cup[-1])})")
    return m.astype(np.int64)


def _add_mrope_in_batch(batch: dict[str, Any], media: Sequence[Any]) -> None:
    """M-RoPE table ``[3, T]`` of an in-batch row from the samples' ``media["mrope_position_ids"]``."""
    if not any(m and m.get("mrope_position_ids") is not None for m in media):
        return
    from seqpack.data.media import packed_mrope_position_ids

    n = len(media)
    cu = batch["cu_seqlens"][: n + 1].numpy()
    cup = batch["cu_seqlens_padded"][: n + 1].numpy()
    full = batch["position_ids"][0].expand(3, -1).clone()
    # the force_to_pad tail segment (if any) is all padding: it keeps its 1-D positions
    full[:, : int(cup[-1])] = torch.from_numpy(packed_mrope_position_ids(list(media), cu, cup))
    batch["mrope_position_ids"] = full


class InBatchPackingCollator:
    """Pack a micro-batch of unpacked samples into one THD row at collate time.

    Each sample becomes a segment padded to ``round_up(len, multiple)`` (``multiple`` from
    ``compute_pad_multiple``, see ``context_parallel_size``); labels stay
    shifted per sample so none crosses a boundary (B03); positions restart per segment.

    Args:
        pad_token_id: id written into padding slots (never used to find lengths).
        pad_to_multiple_of: user per-segment multiple (>= 1).
        context_parallel_size: CP size; the multiple actually used is
            ``seqpack.padding.compute_pad_multiple(pad_to_multiple_of, context_parallel_size)``
            (``lcm`` with ``2*CP``, Transformer Engine's THD CP rule), the one source of truth.
        seq_length: optional capacity; a micro-batch whose padded total exceeds it raises.
        force_to_pad_to_seq_len: pad the row to exactly ``seq_length`` with the tail as its own
            empty segment (module docstring; Megatron-Bridge's VLM layout). Requires ``seq_length``
            divisible by ``pad_to_multiple_of``.
        format, attn_implementation, mask_dtype: as in :class:`PackedCollator`.
        label_convention: ``"shifted"`` (``Sample``) or ``"hf"`` (mapping features with HF labels).
            With ``"shifted"``, a micro-batch whose labels equal ``input_ids`` on every trained slot
            triggers one ``UserWarning`` per collator (HF-style labels passed by mistake).

    Raises:
        ValueError: bad settings (naming the key), an empty sample, or an over-full micro-batch
            (naming sample ids and lengths).
    """

    def __init__(self, pad_token_id: int, *, pad_to_multiple_of: int = 1, seq_length: int | None = None,
                 force_to_pad_to_seq_len: bool = False, format: str = "thd",
                 attn_implementation: str | None = None, mask_dtype=None, label_convention: str = "shifted",
                 context_parallel_size: int = 1):
        from seqpack.padding import compute_pad_multiple

        _check_format(format, attn_implementation)
        m = compute_pad_multiple(pad_to_multiple_of, context_parallel_size)
        if force_to_pad_to_seq_len and seq_length is None:
            raise ValueError("force_to_pad_to_seq_len=True needs seq_length")
        if seq_length is not None:
            check_seq_length(seq_length, m, {"pad_to_multiple_of": pad_to_multiple_of,
                                             "context_parallel_size": context_parallel_size})
        if label_convention not in ("shifted", "hf"):
            raise ValueError(f"label_convention must be 'shifted' or 'hf', got {label_convention!r}")
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = m
        self.seq_length = seq_length
        self.force_to_pad_to_seq_len = bool(force_to_pad_to_seq_len)
        self.format = format
        self.attn_implementation = attn_implementation
        self.mask_dtype = mask_dtype
        self.label_convention = label_convention
        self._warned_unshifted = False

    def _check_unshifted(self, rows) -> None:
        """Warn once when ``label_convention="shifted"`` labels look HF-style (``labels == input_ids`` on
        every trained slot of the micro-batch, at least 2 of them): training would then learn to copy
        the current token instead of predicting the next one."""
        if self._warned_unshifted or self.label_convention != "shifted":
            return
        n = same = 0
        for ids, lab, _ in rows:
            m = lab != IGNORE_INDEX
            n += int(m.sum())
            same += int((lab[m] == ids[m]).sum())
        if n >= 2 and same == n:
            import warnings

            self._warned_unshifted = True
            warnings.warn(
                f"InBatchPackingCollator: labels equal input_ids on all {n} trained slots of this micro-batch "
                "(sample ids " + ", ".join(r[2] for r in rows[:3]) + "): they look like HF-style unshifted labels, "
                "but label_convention='shifted' expects labels[t] = input_ids[t+1]. Pass "
                "label_convention='hf' (or build Samples with seqpack.data.sample.shift_labels).",
                UserWarning, stacklevel=3)

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        if len(features) == 0:
            raise ValueError("InBatchPackingCollator got an empty batch")
        rows = [_sample_arrays(f, self.label_convention, i) for i, f in enumerate(features)]
        self._check_unshifted(rows)
        batch = _assemble_row(
            [r[0] for r in rows], [r[1] for r in rows],
            multiple=self.pad_to_multiple_of, pad_token_id=self.pad_token_id, seq_length=self.seq_length,
            force_to_pad_to_seq_len=self.force_to_pad_to_seq_len, sample_ids=[r[2] for r in rows],
        )
        media = [_get(f, "media", None) for f in features]
        _add_mrope_in_batch(batch, media)
        _add_media(batch, media)
        return _format(batch, self.format, self.attn_implementation, self.mask_dtype)
