"""Checks made before any data is read or model built: model folder, device, attention, output folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from seqpack_bench.timing import ensure_out_dir
from seqpack_bench.train.config import TINY_MODELS, WEIGHT_FILES, TrainConfig, _namer, one_line


def _check_model(cfg: TrainConfig, n: Callable[[str], str]) -> None:
    """A tiny name, or a folder holding ``config.json`` (readable by ``AutoConfig``) and weights:
    one of :data:`WEIGHT_FILES` or a ``*.index.json`` shard index (what ``from_pretrained`` loads)."""
    if cfg.model in TINY_MODELS:
        return
    folder = Path(cfg.model)
    if folder.exists() and not folder.is_dir():
        model_file = folder.name == "config.json" or folder.name in WEIGHT_FILES or folder.name.endswith(
            (".safetensors", ".index.json", ".bin"))
        hint = f" It is a file of a model folder; the model is its folder, {folder.parent}." if model_file else ""
        raise FileNotFoundError(
            f"{n('model')}: {cfg.model} is a file, not a model folder.{hint} Fix: pass the folder "
            "model.save_pretrained(...) wrote (config.json + weights), or one of " + "/".join(TINY_MODELS))
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{n('model')}: {cfg.model} is neither {'/'.join(TINY_MODELS)} nor an existing local model folder. "
            "Fix: pass one of those names, or a folder with config.json + weights (no download at run time)")
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if not any((folder / w).is_file() for w in WEIGHT_FILES) and not any(folder.glob("*.index.json")):
        missing.append(f"weights ({', '.join(WEIGHT_FILES)} or a *.index.json shard index)")
    if missing:
        raise FileNotFoundError(
            f"{n('model')}: the folder {cfg.model} has no {' and no '.join(missing)}. Fix: pass a folder saved by "
            f"model.save_pretrained(...) (config.json + weights + tokenizer files), or {n('model')} tiny-qwen3")
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any config problem is the folder's, said in one line
        raise ValueError(f"{n('model')}: {folder / 'config.json'} cannot be read by transformers "
                         f"({type(exc).__name__}: {one_line(exc)}). Fix: pass a folder saved by "
                         "model.save_pretrained(...) with this transformers version") from None


def check_runtime(cfg: TrainConfig, *, option_names: dict[str, str] | None = None) -> None:
    """Check that this machine can run ``cfg`` before any data is read or model built.

    Checks ``model`` (a tiny name, or a folder with ``config.json`` that transformers reads and weights:
    ``model.safetensors``, ``pytorch_model.bin`` or a ``*.index.json`` shard index), ``device`` (a valid torch device; ``cuda``
    needs a CUDA build of torch and a visible device, ``cuda:N`` needs N < device count, ``mps`` an MPS
    backend) and ``attn_implementation`` (one of ``seqpack.collate.HF_ATTN``; ``flash_attention_2`` /
    ``_3`` need a CUDA device and an importable ``flash_attn`` / ``flash_attn_interface``;
    ``flex_attention`` has no backward on CPU).

    Args:
        cfg: the settings.
        option_names: how to name fields in messages (``seqpack train`` passes :data:`CLI_OPTION_NAMES`).

    Raises:
        FileNotFoundError: ``model`` is neither a tiny name nor an existing folder, or the folder lacks
            ``config.json`` or weights (one line naming what is missing).
        ValueError: ``config.json`` that transformers cannot read; a device or attention implementation
            this machine cannot run (names the field and the fix).
    """
    import torch

    n = _namer(option_names)
    _check_model(cfg, n)
    try:
        dev = torch.device(cfg.device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(f"{n('device')}: {cfg.device!r} is not a torch device ({one_line(exc)}). "
                         f"Fix: {n('device')} cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise ValueError(f"{n('device')}: {cfg.device!r} needs a CUDA build of torch, but this torch "
                             f"({torch.__version__}) has no CUDA. Fix: {n('device')} cpu, or run on a GPU machine "
                             "with a CUDA build of torch")
        if not torch.cuda.is_available():
            raise ValueError(f"{n('device')}: {cfg.device!r} but torch sees no CUDA device. Fix: {n('device')} cpu, "
                             "or check the driver / CUDA_VISIBLE_DEVICES")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{n('device')}: {cfg.device!r} but only {torch.cuda.device_count()} CUDA device(s) "
                             f"are visible. Fix: {n('device')} cuda:0")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"{n('device')}: 'mps' is not available on this machine. Fix: {n('device')} cpu")
    from seqpack.collate import HF_ATTN

    attn = cfg.attn_implementation
    if attn not in HF_ATTN:
        raise ValueError(f"{n('attn_implementation')}: unknown attention implementation {attn!r}; "
                         f"use one of {', '.join(HF_ATTN)} (sdpa on CPU)")
    if attn.startswith("flash_attention"):
        if dev.type != "cuda":
            raise ValueError(f"{n('attn_implementation')} {attn} runs on CUDA only, but {n('device')} is "
                             f"{cfg.device!r}. Fix: {n('attn_implementation')} sdpa (or {n('device')} cuda on a GPU)")
        pkg = "flash_attn" if attn == "flash_attention_2" else "flash_attn_interface"
        try:
            __import__(pkg)
        except Exception as exc:  # noqa: BLE001 - ImportError or a broken build (undefined symbol)
            raise ValueError(f"{n('attn_implementation')} {attn} needs the {pkg} package, which does not import "
                             f"here ({type(exc).__name__}: {one_line(exc)}). Fix: {n('attn_implementation')} sdpa, or install "
                             "a flash-attn build matching this torch and CUDA") from None
    if attn == "flex_attention" and dev.type == "cpu":
        raise ValueError(f"{n('attn_implementation')} flex_attention has no backward pass on CPU. "
                         f"Fix: {n('attn_implementation')} sdpa")


def check_out_dir(out_dir: str | os.PathLike | None, *, option_names: dict[str, str] | None = None) -> Path | None:
    """Create ``out_dir`` (parents included) and check that a file can be written in it.

    Done before any work, so a bad folder fails at once instead of after the run. The check itself is
    :func:`seqpack_bench.timing.ensure_out_dir` (shared with the benchmarks); this adds the ``None`` case
    and names the field through ``option_names``.

    Returns:
        the folder as a ``Path`` (``None`` when ``out_dir`` is ``None`` or ``""``: nothing is written).

    Raises:
        ValueError: (``seqpack_bench.timing.OutputDirError``) ``out_dir`` is blank, a file, below a file, or
            cannot be created or written; names the field (``out_dir``, or ``--out`` with
            :data:`CLI_OPTION_NAMES`), the path, the reason and the fix.
    """
    if not out_dir:
        return None
    return ensure_out_dir(out_dir, option=_namer(option_names)("out_dir"))
