"""The data of the reference loop: chat files prepared with seqpack (or synthetic samples), and the tokenizer."""

from __future__ import annotations

import glob as _glob
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.data import load_tokenizer, prepare
from seqpack.sample import Sample, shift_labels
from seqpack_bench.paths import shared_data_dir
from seqpack_bench.train.config import TINY_MODELS, TrainConfig, _namer, _settable, one_line


def synthetic_samples(n: int, *, vocab_size: int, seed: int = 0, median: float = 250.0, sigma: float = 1.0,
                      max_length: int = 4096, prompt_fraction: float = 0.3) -> list[Any]:
    """``n`` random-token ``Sample`` s with a seed-like SFT length mix (lognormal, median ``median``).

    The first ``prompt_fraction`` of each sample is untrained (labels -100), the rest is trained
    (shifted labels, ``Sample`` contract). Token ids are uniform in ``[1, vocab_size)``.
    """
    rng = np.random.default_rng(seed)
    lens = np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 2, max_length).astype(np.int64)
    out = []
    for i, n_tok in enumerate(lens):
        ids = rng.integers(1, vocab_size, int(n_tok)).astype(np.int32)
        trainable = np.arange(n_tok) >= int(n_tok * prompt_fraction)
        out.append(Sample(input_ids=ids, labels=shift_labels(ids, trainable), sample_id=f"synthetic:{i}",
                          source="synthetic", index=i))
    return out


def resolve_tokenizer(cfg: TrainConfig) -> str:
    """``cfg.tokenizer``, else ``"qwen3"`` for tiny configs, else the local model folder."""
    if cfg.tokenizer:
        return cfg.tokenizer
    return "qwen3" if cfg.model in TINY_MODELS else cfg.model


def default_data() -> Path:
    """``../shared/data/llama-factory/alpaca_en_demo.json`` beside the checkout when present, else the
    embedded ``sample_chat.jsonl``."""
    alpaca = shared_data_dir() / "llama-factory" / "alpaca_en_demo.json"
    if alpaca.is_file():
        return alpaca
    from seqpack.pipeline import sample_data_path

    return sample_data_path()


def expand_data_paths(data: Sequence[str | os.PathLike], *, option_names: dict[str, str] | None = None) -> list[Path]:
    """Expand data arguments to files: globs (``*``, ``?``, ``[``; ``**`` recursive) are expanded and
    sorted, folders refused, missing files refused.

    Raises:
        FileNotFoundError: a file does not exist, or a glob matches no file, or only folders (names the
            field and the argument).
        ValueError: a folder was given (say which glob to use instead).
    """
    n = _namer(option_names)
    out: list[Path] = []
    for item in data:
        s = os.fspath(item)
        if any(ch in s for ch in "*?["):
            matches = sorted(_glob.glob(s, recursive=True))
            files = [Path(m) for m in matches if Path(m).is_file()]
            if not files and matches:
                shown = ", ".join(matches[:3]) + (f" and {len(matches) - 3} more" if len(matches) > 3 else "")
                base = s.rstrip("/")
                raise FileNotFoundError(f"{n('data')}: the glob {s!r} matched only folders ({shown}), no file. "
                                        f"Fix: a pattern that reaches the files, e.g. '{base}/*.jsonl' or "
                                        f"'{base.rsplit('/', 1)[0] if '/' in base else '.'}/**/*.jsonl'")
            if not files:
                raise FileNotFoundError(f"{n('data')}: the glob {s!r} matches no file (cwd = {os.getcwd()}). "
                                        "Fix: check the pattern; quote it so the shell does not expand it")
            out.extend(files)
        elif Path(s).is_dir():
            raise ValueError(f"{n('data')}: {s!r} is a folder. Fix: pass data files (.json, .jsonl, .parquet) or "
                             f"a quoted glob such as '{s.rstrip('/')}/*.jsonl'")
        elif not Path(s).exists():
            raise FileNotFoundError(f"{n('data')}: file not found: {s} (cwd = {os.getcwd()})")
        else:
            out.append(Path(s))
    return out


def summarize_prepare_report(report: Any) -> str:
    """One line from a ``seqpack.data.PrepareReport``: records read, samples kept, tokens, and the
    entries by status and reason, e.g. ``999 records read -> 111 samples (1,776 tokens); truncated:
    overlength 111; dropped: no_trainable_tokens 888``."""
    line = f"{report.records_read:,} records read -> {report.samples_out:,} samples ({report.tokens:,} tokens)"
    for status, reasons in report.by_reason().items():
        line += f"; {status}: " + ", ".join(f"{r} {c:,}" for r, c in reasons.items())
    return line


def load_train_tokenizer(cfg: TrainConfig, *, option_names: dict[str, str] | None = None) -> Any:
    """Load the tokenizer of :func:`resolve_tokenizer` (a preflight check: ``seqpack train`` calls it
    before any data is read, so a bad ``--tokenizer`` is an option error, not a data error).

    Returns:
        a ``transformers`` tokenizer (``seqpack.data.load_tokenizer``: with a chat template).

    Raises:
        ValueError: one line naming ``tokenizer`` (or ``model`` when the tokenizer comes from the model
            folder), the library's reason (line breaks collapsed) and the fix; or, with a local model
            folder, a tokenizer with more tokens than the model's ``config.json`` ``vocab_size``.
    """
    n = _namer(option_names)
    try:
        tok = load_tokenizer(resolve_tokenizer(cfg))
    except (ValueError, OSError) as exc:  # TokenizerError is a ValueError
        if cfg.tokenizer:
            raise ValueError(f"{n('tokenizer')}: {one_line(exc)}") from None
        alt = (f" and no {n('tokenizer')} is given (pass {n('tokenizer')} qwen3, the embedded one, or a folder with "
               "tokenizer files)" if _settable(option_names, "tokenizer") else "")
        raise ValueError(f"{n('model')}: the folder {cfg.model} has no usable tokenizer{alt}: {one_line(exc)}") from None
    if cfg.model not in TINY_MODELS:  # the data's ids must fit the model's embedding
        from transformers import AutoConfig

        vocab = getattr(AutoConfig.from_pretrained(cfg.model, local_files_only=True), "vocab_size", None)
        if vocab is not None and len(tok) > vocab:
            who = f"{n('tokenizer')} {cfg.tokenizer}" if cfg.tokenizer else f"the tokenizer of {n('model')} {cfg.model}"
            raise ValueError(f"{who} has {len(tok):,} tokens but {n('model')} {cfg.model} has a vocabulary of "
                             f"{vocab:,} (config.json vocab_size): its ids would index past the embedding. Fix: the "
                             f"tokenizer the model was trained with ({n('tokenizer')} <folder>)")
    return tok


def prepare_data(inputs: Any, cfg: TrainConfig, *, option_names: dict[str, str] | None = None,
                 log: Callable[[str], None] = print, tokenizer: Any = None) -> tuple[list[Any], int, Any]:
    """Prepare chat data for :func:`run_training` and say what became of it.

    ``seqpack.data.prepare(inputs, tokenizer, seq_length=cfg.seq_length)`` (over-length samples
    truncated, samples without a trainable token dropped) with ``tokenizer`` (default: loaded by
    :func:`load_train_tokenizer`); logs ``prepare: <summarize_prepare_report>``.

    Returns:
        ``(samples, pad_token_id, report)``; the pad id is the tokenizer's pad token, else its EOS.

    Raises:
        ValueError: no sample is left (names ``seq_length`` and the counts by reason); the tokenizer
            cannot be loaded (names ``tokenizer``, or ``model`` when it comes from the model); and what
            ``prepare`` raises: ``DataFormatError`` (file, line/record and fix), ``TokenizerError``
            (both ``ValueError``), ``FileNotFoundError``.
    """
    n = _namer(option_names)
    tok = tokenizer if tokenizer is not None else load_train_tokenizer(cfg, option_names=option_names)
    samples, report = prepare(inputs, tok, seq_length=cfg.seq_length, keep_image_placeholders=True)  # text-only training; loop.py warns
    summary = summarize_prepare_report(report)
    log(f"prepare: {summary}")
    if not samples:
        hint = ""
        if report.count("dropped", "no_trainable_tokens") or report.count("truncated"):
            hint = (f" At {n('seq_length')} {cfg.seq_length} the samples are cut before their first trained "
                    f"(assistant) token. Fix: raise {n('seq_length')}")
        if report.records_read == 0:
            hint = " The inputs hold no record."
        raise ValueError(f"no samples to train on: {summary}.{hint}")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return samples, int(pad), report
