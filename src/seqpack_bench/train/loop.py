"""The reference training loop: the same samples trained padded, packed, in-batch packed and streamed.

``seqpack train --mode all`` (or :func:`run_training`) trains one HF causal LM per mode, all from the
same initial weights, on **the same samples in the same order**: the step plan is a packing plan
(``seqpack.algorithms.pack_lengths`` over the sample lengths, capacity ``seq_length``, default
``first_fit_shuffle`` so that pack content is random like an ordinary shuffled batch) and step ``k``
of every mode holds exactly the samples of pack ``k``. The step plan decides how much the padded
baseline pads: on the alpaca demo at 2048 tokens, padding each pack's samples as one batch costs
2.35x the real tokens with ``first_fit_shuffle`` against 2.33x for random batches of the same size,
but only 1.59x with ``randomized_best_fit`` and 1.13x with ``balanced_best_fit`` (length-sorted
planners group similar lengths, like ``group_by_length``, and flatter the padded baseline):

``padded``
    the unpacked baseline: pack ``k``'s samples right-padded to the longest (``PaddedCollator``,
    ``[B, S]``, 2-D attention mask);
``packed``
    offline packs: ``build_packed_sequence`` rows (built before training, as ``seqpack pack`` does)
    collated by ``PackedCollator`` into one THD row and run with ``seqpack.hf.packed_forward``;
``in_batch``
    the same samples packed at collate time (``InBatchPackingCollator``) into one THD row;
``streaming``
    ``seqpack.stream.StreamingPacker`` chooses its own packs (producer-side buffer), so it is
    compared with its own padded twin, ``padded_stream`` (the streaming packs' samples, padded),
    trained from the same initial weights.

Modes are interleaved step by step (step ``k`` of every mode, in a rotating order) so that a busy
machine slows all of them alike. Every step's loss is the **token mean** of the cross entropy over
that step's loss tokens (``seqpack.loss.packed_cross_entropy``: sum / count), so all modes optimise
the same objective. Loss agreement is checked against the padded reference at each step:
``max_k |loss_mode[k] - loss_padded[k]|`` must stay within ``loss_tolerance`` (default 1e-3 nats;
measured in fp32 on CPU: identical at step 1, max 1.4e-5 to 4.1e-5 (packed, in_batch) and 6e-6 to
1.0e-4 (streaming) over 60-100 AdamW steps, depending on the step plan; the drift is float rounding of
different kernels, amplified by the optimiser).

Throughput per mode: real tokens/s (tokens of the samples), slot tokens/s (tokens the model
computed, padding included) and padding fraction = 1 - real / slots, from the summed step times
after ``warmup_steps``. Speed-up over ``padded`` = padded time / mode time on the same samples;
the ideal ratio is padded slots / real tokens (what the speed-up would be if time were proportional
to computed tokens). Goal (issue #7): speed-up >= 90 % of the ideal ratio.

Exit status and verdicts: the loss-agreement checks are correctness checks (``seqpack train`` exits 1
when one fails); the speed verdicts (% of ideal) are informational, because step times on a shared
box are noisy: they never change the exit status, and with fewer than :data:`MIN_TIMED_STEPS` timed
steps (after ``warmup_steps``) no speed verdict is given at all ("not enough timed steps").

Data: when ``run_training`` (or ``seqpack train``) prepares the data itself it prints a one-line summary
of ``seqpack.data.prepare``'s report (records read, samples kept, truncated/dropped by reason), and
fails naming ``seq_length`` and the drop reasons when no sample is left. Records with images (VLM data)
are trained **as text**: the models here are text-only causal LMs, so the images are ignored and the
image placeholder text (e.g. ``<image>``) is trained as ordinary tokens; a warning line says so. The
mode comparison still holds (every mode sees the same tokens), but it says nothing about vision
towers (use ``seqpack pack`` and your VLM trainer for that). When the data gives fewer packs than
``steps``, or ``warmup_steps`` leaves fewer than that many steps, a line says what is run instead.

Model: ``"tiny-qwen3"`` (default) or ``"tiny-llama"`` build a small random-init config in code
(:func:`tiny_config`); any other string is a local folder for ``AutoModelForCausalLM.from_pretrained``
(no download), checked before any data is read (:func:`check_runtime`): it must hold ``config.json`` and
weights (``model.safetensors``, ``pytorch_model.bin`` or a ``*.index.json`` shard index), and its
tokenizer files unless a tokenizer is given (:func:`load_train_tokenizer`). With a tiny config the vocabulary is *compacted* to the token ids that occur in the
data (``compact_vocab``), so the LM head does not dominate a CPU run; the remapping is a bijection on
the used ids, so losses are ordinary cross entropies over that vocabulary.
"""

from __future__ import annotations

import copy
import glob as _glob
import math
import os
import re
import time
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = [
    "MODES",
    "TrainConfig",
    "tiny_config",
    "build_model",
    "compact_vocabulary",
    "plan_steps",
    "synthetic_samples",
    "default_data",
    "resolve_tokenizer",
    "load_train_tokenizer",
    "expand_data_paths",
    "prepare_data",
    "summarize_prepare_report",
    "check_out_dir",
    "check_runtime",
    "CLI_OPTION_NAMES",
    "MIN_TIMED_STEPS",
    "MAX_SEQ_LENGTH",
    "WEIGHT_FILES",
    "one_line",
    "run_training",
]

MODES = ("padded", "packed", "in_batch", "streaming")
TINY_MODELS = ("tiny-qwen3", "tiny-llama")
#: fewest timed steps (after ``warmup_steps``) for a speed verdict; with fewer the verdict is "n/a".
MIN_TIMED_STEPS = 3
#: largest ``seq_length``: the step plan packs at ``pad_to_multiple_of=1``, and ``seqpack.algorithms``
#: accepts at most ``MAX_CAPACITY_UNITS`` (2**24) capacity units (its kernels keep O(capacity) tables).
MAX_SEQ_LENGTH = 1 << 24
#: weight files ``from_pretrained`` loads from a local folder (transformers' SAFE_WEIGHTS_NAME, WEIGHTS_NAME);
#: a sharded checkpoint has a ``*.index.json`` shard index instead (model.safetensors.index.json, ...).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: how ``seqpack train`` names the :class:`TrainConfig` fields in messages (``option_names=`` of the checks).
CLI_OPTION_NAMES = {
    "modes": "--mode", "steps": "--steps", "seq_length": "--seq-length", "model": "--model",
    "hidden_size": "--hidden-size", "num_layers": "--num-layers", "intermediate_size": "--intermediate-size",
    "num_heads": "--num-heads", "num_kv_heads": "--num-kv-heads",
    "attn_implementation": "--attn", "device": "--device", "dtype": "--dtype", "lr": "--lr", "seed": "--seed",
    "algorithm": "--algorithm", "warmup_steps": "--warmup-steps", "loss_tolerance": "--tolerance",
    "num_threads": "--threads", "out_dir": "--out", "tokenizer": "--tokenizer", "data": "--data",
}


def _namer(option_names: dict[str, str] | None) -> Callable[[str], str]:
    """``field -> display name`` (the option name when given, else the field name)."""
    names = option_names or {}
    return lambda f: names.get(f, f)


def _settable(option_names: dict[str, str] | None, field_: str) -> bool:
    """Whether the user can set ``field_``: always from Python (``option_names`` None), else only when the
    caller (a command line) names an option for it; a fix must not advise an option that does not exist."""
    return option_names is None or field_ in option_names


def _timed_steps_fix(option_names: dict[str, str] | None) -> str:
    """How to get more timed steps, naming only options the caller has."""
    n = _namer(option_names)
    lower = f" or lower {n('warmup_steps')}" if _settable(option_names, "warmup_steps") else ""
    return f"raise {n('steps')}{lower}"


def one_line(text: object) -> str:
    """``str(text)`` with every line break (and the blanks around it) replaced by one space.

    Library messages (transformers, huggingface_hub) often span several lines; a command-line error
    must stay one line (``error: ...``), so the CLI and the GPU benchmark pass every message through this.
    """
    text = re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()
    return re.sub(r"(?<!\.)\.\.(?=\s|$)", ".", text)  # "reason.. Fix" (a message ending in "." + ". Fix")


@dataclass
class TrainConfig:
    """Settings of :func:`run_training`.

    Every field is checked when the config is built (and again by :func:`run_training`):
    :meth:`validate` raises ``ValueError`` naming the field, or the option of ``option_names`` (an
    init-only argument, not stored: ``TrainConfig(..., option_names=CLI_OPTION_NAMES)`` makes the
    messages name ``seqpack train``'s options, e.g. ``--lr`` instead of ``lr``).

    Attributes:
        modes: non-empty subset of :data:`MODES`. ``padded`` is added as the reference when ``packed``
            or ``in_batch`` is asked for; ``streaming`` brings its own reference ``padded_stream``
            (the streaming packs' samples, padded), so ``modes=("streaming",)`` trains only those two.
        steps: optimizer steps per mode (``None`` = one epoch of packs, else >= 1); one step = one
            pack's samples. Fewer are run (and logged) when the data gives fewer packs.
        seq_length: pack capacity in tokens (2 .. :data:`MAX_SEQ_LENGTH`; the step size in tokens for
            packed modes).
        model: ``"tiny-qwen3"`` | ``"tiny-llama"`` | a local model folder.
        hidden_size, num_layers, intermediate_size, num_heads, num_kv_heads: tiny-config sizes (ignored
            for a local model folder). With a tiny model ``hidden_size`` must be a multiple of
            ``num_heads`` with an even quotient (``head_dim``; rotary embeddings rotate pairs), and
            ``num_heads`` a multiple of ``num_kv_heads`` (grouped-query attention).
        attn_implementation: one of ``seqpack.collate.HF_ATTN``: ``"sdpa"`` (default, CPU and GPU),
            ``"eager"``, ``"flex_attention"`` (CUDA: no backward on CPU), ``"flash_attention_2"`` /
            ``"flash_attention_3"`` (CUDA + flash-attn); checked against the machine by :func:`check_runtime`.
        device, dtype: torch device string and ``"float32"`` | ``"bfloat16"``.
        lr: AdamW learning rate (finite, > 0; weight decay 0, no dropout, so every mode follows the same maths).
        seed: weight init, pack order and streaming seed.
        algorithm: packing algorithm of the step plan (a ``seqpack.algorithms.PackingAlgorithm`` name,
            ``None`` = the library default). Default ``first_fit_shuffle``: packs of
            random content, so the padded baseline sees ordinary random micro-batches (measured
            padded/real ratio within 3 % of random batches of the same size); a length-sorting
            planner would group similar lengths and flatter the padded baseline (module docstring).
        warmup_steps: first steps left out of the throughput figures (>= 0; still in the loss curves).
            At most ``steps - 1`` are left out (logged when that clamps).
        loss_tolerance: max |loss delta| (nats, token mean, finite, >= 0) vs the padded reference
            (``inf`` would switch the correctness check off, so it is refused).
        compact_vocab: remap token ids to the ones present (tiny configs only).
        packing_buffer_size: streaming packer buffer.
        autocast_dtype: ``"bfloat16"`` = mixed precision (``torch.autocast``) over ``dtype`` weights
            (fp32 master weights, bf16 matmuls: the usual GPU recipe); ``None`` = off.
        vocab_size: vocabulary of a tiny config when ``compact_vocab`` is off (default: max id + 1).
        max_samples: use only the first samples (``None`` = all).
        tokenizer: tokenizer used when ``run_training`` prepares the data itself (``None``: the
            embedded ``"qwen3"`` for tiny models, the model folder for local weights).
        num_threads: ``torch.set_num_threads`` for the run (``None`` = torch's default). On a shared,
            busy CPU box 1 thread gives steadier timings (no OpenMP barrier waiting on preempted threads).
        out_dir: where ``train.json``, ``train_loss.png`` and ``train_throughput.png`` go (None = nowhere).
        progress: show a rich progress bar.
    """

    modes: Sequence[str] = MODES
    steps: int | None = 100
    seq_length: int = 512
    model: str = "tiny-qwen3"
    hidden_size: int = 128
    num_layers: int = 2
    intermediate_size: int = 512
    num_heads: int = 4
    num_kv_heads: int = 2
    attn_implementation: str = "sdpa"
    device: str = "cpu"
    dtype: str = "float32"
    lr: float = 1e-3
    seed: int = 0
    algorithm: str | None = "first_fit_shuffle"
    warmup_steps: int = 2
    loss_tolerance: float = 1e-3
    compact_vocab: bool = True
    packing_buffer_size: int = 1000
    autocast_dtype: str | None = None
    vocab_size: int | None = None
    max_samples: int | None = None
    num_threads: int | None = None
    tokenizer: str | None = None
    out_dir: str | None = "bench_results"
    progress: bool = True
    option_names: InitVar[dict[str, str] | None] = None

    def __post_init__(self, option_names: dict[str, str] | None = None) -> None:
        self.validate(option_names)

    def validate(self, option_names: dict[str, str] | None = None) -> None:
        """Check the values (not the machine: see :func:`check_runtime`).

        Args:
            option_names: how to name fields in messages (e.g. :data:`CLI_OPTION_NAMES`); default the
                field name.

        Raises:
            ValueError: names the field, the value and the allowed range: empty or unknown ``modes``,
                ``steps`` not None and < 1, ``seq_length`` outside 2 .. :data:`MAX_SEQ_LENGTH`,
                ``warmup_steps`` < 0, ``loss_tolerance`` < 0, NaN or infinite, ``lr`` <= 0, NaN or infinite,
                sizes < 1, a tiny-model shape the model cannot build (``hidden_size`` not a multiple of
                ``num_heads``, odd ``head_dim``, ``num_heads`` not a multiple of ``num_kv_heads``; the
                message gives values that work), unknown ``algorithm`` (lists the choices), unknown
                ``dtype`` / ``autocast_dtype``, ``max_samples`` < 1, ``packing_buffer_size`` < 1,
                ``num_threads`` < 0.
        """
        n = _namer(option_names)
        if isinstance(self.modes, str):
            raise ValueError(f"{n('modes')} must be a sequence of mode names, got the string {self.modes!r}")
        modes = list(self.modes)
        if not modes:
            raise ValueError(f"{n('modes')} is empty; choose from {', '.join(MODES)} (or 'all' on the command line)")
        bad = [m for m in modes if m not in MODES]
        if bad:
            raise ValueError(f"{n('modes')}: unknown mode(s) {', '.join(map(repr, bad))}; choose from "
                             f"{', '.join(MODES)} (or 'all' on the command line)")

        def need(field_: str, ok: bool, rule: str) -> None:
            if not ok:
                raise ValueError(f"{n(field_)} must be {rule}, got {getattr(self, field_)!r}")

        def is_int(v: Any) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        need("steps", self.steps is None or (is_int(self.steps) and self.steps >= 1), "None or an integer >= 1")
        need("seq_length", is_int(self.seq_length) and self.seq_length >= 2, "an integer >= 2")
        if self.seq_length > MAX_SEQ_LENGTH:
            raise ValueError(f"{n('seq_length')} must be <= {MAX_SEQ_LENGTH} (the step plan's packing kernels keep "
                             f"tables of {n('seq_length')} entries), got {self.seq_length}. "
                             f"Fix: {n('seq_length')} {MAX_SEQ_LENGTH} or less")
        need("warmup_steps", is_int(self.warmup_steps) and self.warmup_steps >= 0, "an integer >= 0")

        def is_finite(v: Any) -> bool:
            return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and \
                math.isfinite(v)

        need("loss_tolerance", is_finite(self.loss_tolerance) and self.loss_tolerance >= 0,
             "a finite number >= 0 (nats; inf would switch the loss-agreement check off)")
        need("lr", is_finite(self.lr) and self.lr > 0, "a finite number > 0")
        for f in ("hidden_size", "num_layers", "intermediate_size", "num_heads", "num_kv_heads",
                  "packing_buffer_size"):
            need(f, is_int(getattr(self, f)) and getattr(self, f) >= 1, "an integer >= 1")
        if self.model in TINY_MODELS:
            self._validate_shape(n)
        from seqpack.algorithms import PackingAlgorithm

        choices = [a.value for a in PackingAlgorithm]
        if self.algorithm is not None and self.algorithm not in choices:
            raise ValueError(f"{n('algorithm')}: unknown packing algorithm {self.algorithm!r}; choose one of: "
                             f"{', '.join(choices)}")
        need("max_samples", self.max_samples is None or (is_int(self.max_samples) and self.max_samples >= 1),
             "None or an integer >= 1")
        need("num_threads", self.num_threads is None or (is_int(self.num_threads) and self.num_threads >= 0),
             "None or an integer >= 0 (0 = torch's default)")
        need("dtype", self.dtype in ("float32", "bfloat16"), "'float32' or 'bfloat16'")
        need("autocast_dtype", self.autocast_dtype in (None, "bfloat16", "float16"), "None, 'bfloat16' or 'float16'")

    def _validate_shape(self, n: Callable[[str], str]) -> None:
        """The tiny model's attention shape (what ``tiny_config`` / transformers would refuse later)."""
        hidden, heads, kv = self.hidden_size, self.num_heads, self.num_kv_heads
        hs, nh, nkv = n("hidden_size"), n("num_heads"), n("num_kv_heads")

        def near(step: int, around: int) -> str:  # multiples of `step` around `around`
            lo = max(step, (around // step) * step)
            return f"{lo} or {lo + step}" if lo != around else str(lo)

        if hidden % heads or (hidden // heads) % 2:
            good_heads = [h for h in range(1, min(hidden, 64) + 1)
                          if hidden % h == 0 and (hidden // h) % 2 == 0 and h % kv == 0]
            why = ("is not a multiple of" if hidden % heads else
                   f"gives an odd head size {hidden // heads} (rotary embeddings need an even one) with")
            raise ValueError(
                f"{hs} {hidden} {why} {nh} {heads} (head size = {hs} / {nh}). Fix: {hs} {near(2 * heads, hidden)}"
                + (f", or {nh} {', '.join(map(str, good_heads[-4:]))}" if good_heads else ""))
        if heads % kv:
            divisors = [k for k in range(1, heads + 1) if heads % k == 0]
            raise ValueError(f"{nh} {heads} is not a multiple of {nkv} {kv} (grouped-query attention shares each "
                             f"key/value head among {nh} / {nkv} query heads). Fix: {nkv} one of "
                             f"{', '.join(map(str, divisors))}")


def tiny_config(family: str = "qwen3", *, vocab_size: int, hidden_size: int = 256, num_layers: int = 2,
                intermediate_size: int = 768, num_heads: int = 4, num_kv_heads: int = 2,
                max_position_embeddings: int = 32768, attn_implementation: str = "sdpa"):
    """A small random-init ``Qwen3Config`` / ``LlamaConfig`` built in code (no download).

    ``head_dim = hidden_size // num_heads``; dropout 0; untied embeddings; ``use_cache=False``.

    Raises:
        ValueError: unknown family, or ``hidden_size`` not divisible by ``num_heads``, or
            ``num_heads`` not divisible by ``num_kv_heads``.
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must divide by num_heads ({num_heads}) and num_heads by "
                         f"num_kv_heads ({num_kv_heads})")
    common = dict(vocab_size=int(vocab_size), hidden_size=hidden_size, num_hidden_layers=num_layers,
                  intermediate_size=intermediate_size, num_attention_heads=num_heads,
                  num_key_value_heads=num_kv_heads, head_dim=hidden_size // num_heads,
                  max_position_embeddings=max_position_embeddings, attention_dropout=0.0,
                  tie_word_embeddings=False, use_cache=False)
    if family == "qwen3":
        from transformers import Qwen3Config

        cfg = Qwen3Config(**common)
    elif family == "llama":
        from transformers import LlamaConfig

        cfg = LlamaConfig(**common)
    else:
        raise ValueError(f"unknown tiny model family {family!r}; use 'qwen3' or 'llama'")
    cfg._attn_implementation = attn_implementation
    return cfg


def build_model(cfg: TrainConfig, vocab_size: int | None):
    """Random-init tiny model (``tiny-*``) or ``from_pretrained(cfg.model)``, on ``cfg.device``/``cfg.dtype``.

    Raises:
        FileNotFoundError: ``cfg.model`` is neither a tiny name nor an existing folder.
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    if cfg.model in TINY_MODELS:
        conf = tiny_config(cfg.model.split("-", 1)[1], vocab_size=vocab_size, hidden_size=cfg.hidden_size,
                           num_layers=cfg.num_layers, intermediate_size=cfg.intermediate_size,
                           num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                           attn_implementation=cfg.attn_implementation)
        model = AutoModelForCausalLM.from_config(conf, attn_implementation=cfg.attn_implementation)
    else:
        _check_model(cfg, _namer(None))
        model = AutoModelForCausalLM.from_pretrained(cfg.model, attn_implementation=cfg.attn_implementation)
    model.config.use_cache = False
    return model.to(device=cfg.device, dtype=dtype).train()


def compact_vocabulary(samples: Sequence[Any], pad_token_id: int) -> tuple[list[Any], int, int]:
    """Remap token ids to ``0..V-1`` over the ids used by ``samples`` (plus the pad id).

    Returns:
        ``(new samples, V, new pad id)``; labels keep -100, other labels are remapped like ids.
    """
    from seqpack.data.sample import Sample

    used = np.unique(np.concatenate([np.asarray(s.input_ids, np.int64) for s in samples]
                                    + [np.asarray(s.labels, np.int64)[np.asarray(s.labels) >= 0] for s in samples]
                                    + [np.array([pad_token_id], np.int64)]))
    lut = np.full(int(used.max()) + 1, -1, np.int64)
    lut[used] = np.arange(used.shape[0])
    out = []
    for s in samples:
        lab = np.asarray(s.labels, np.int64)
        new_lab = np.where(lab >= 0, lut[np.maximum(lab, 0)], -100).astype(np.int32)
        out.append(Sample(input_ids=lut[np.asarray(s.input_ids, np.int64)].astype(np.int32), labels=new_lab,
                          sample_id=s.sample_id, source=s.source, index=s.index, media=s.media, meta=dict(s.meta)))
    return out, int(used.shape[0]), int(lut[pad_token_id])


def plan_steps(lengths: np.ndarray, seq_length: int, *, algorithm: str | None = None, seed: int = 0) -> list[np.ndarray]:
    """Step plan = packing plan: ``pack_lengths(lengths, seq_length)`` bins (int64 index arrays, pack order)."""
    from seqpack.algorithms import DEFAULT_ALGORITHM, pack_lengths

    plan = pack_lengths(np.asarray(lengths, np.int64), seq_length, algorithm or DEFAULT_ALGORITHM, seed=seed)
    return [np.asarray(b, np.int64) for b in plan.bins]


def synthetic_samples(n: int, *, vocab_size: int, seed: int = 0, median: float = 250.0, sigma: float = 1.0,
                      max_length: int = 4096, prompt_fraction: float = 0.3) -> list[Any]:
    """``n`` random-token ``Sample`` s with a seed-like SFT length mix (lognormal, median ``median``).

    The first ``prompt_fraction`` of each sample is untrained (labels -100), the rest is trained
    (shifted labels, ``Sample`` contract). Token ids are uniform in ``[1, vocab_size)``.
    """
    from seqpack.data.sample import Sample, shift_labels

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
    repo = Path(__file__).resolve().parents[2]
    alpaca = repo.parent / "shared" / "data" / "llama-factory" / "alpaca_en_demo.json"
    if alpaca.is_file():
        return alpaca
    from seqpack.pipeline import sample_data_path

    return sample_data_path()


# ------------------------------------------------------------------------------------------ checks
def _check_model(cfg: TrainConfig, n: Callable[[str], str]) -> None:
    """A tiny name, or a folder holding ``config.json`` (readable by ``AutoConfig``) and weights:
    one of :data:`WEIGHT_FILES` or a ``*.index.json`` shard index (what ``from_pretrained`` loads)."""
    if cfg.model in TINY_MODELS:
        return
    folder = Path(cfg.model)
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
    :func:`seqpack.bench.timing.ensure_out_dir` (shared with the benchmarks); this adds the ``None`` case
    and names the field through ``option_names``.

    Returns:
        the folder as a ``Path`` (``None`` when ``out_dir`` is ``None`` or ``""``: nothing is written).

    Raises:
        ValueError: (``seqpack.bench.timing.OutputDirError``) ``out_dir`` is blank, a file, below a file, or
            cannot be created or written; names the field (``out_dir``, or ``--out`` with
            :data:`CLI_OPTION_NAMES`), the path, the reason and the fix.
    """
    if not out_dir:
        return None
    from seqpack.bench.timing import ensure_out_dir

    return ensure_out_dir(out_dir, option=_namer(option_names)("out_dir"))


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
    from seqpack.data import load_tokenizer

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
    from seqpack.data import prepare

    n = _namer(option_names)
    tok = tokenizer if tokenizer is not None else load_train_tokenizer(cfg, option_names=option_names)
    samples, report = prepare(inputs, tok, seq_length=cfg.seq_length)
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


# ---------------------------------------------------------------------------------------------- steps
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step_inputs(mode: str, samples: Sequence[Any], row: Any, pad_id: int):
    """Collate one step. Returns ``(kind, batch, slots)``; kind ``"padded"`` or ``"thd"``."""
    from seqpack.collate import InBatchPackingCollator, PackedCollator, PaddedCollator

    if mode in ("padded", "padded_stream"):
        b = PaddedCollator(pad_id, format="shifted")(samples)
        return "padded", b, int(b["input_ids"].numel())
    if mode == "in_batch":
        b = InBatchPackingCollator(pad_id, format="thd")(samples)
    else:  # packed / streaming: a pre-built PackedSequence row
        b = PackedCollator(format="thd")([row])
    return "thd", b, int(b["input_ids"].shape[-1])


def _batch_sample_ids(kind: str, batch: dict, samples: Sequence[Any]) -> list[str]:
    """Sample ids of what the step actually consumed (THD batches carry ``sample_ids``)."""
    if kind == "thd":
        return [str(x) for x in batch["sample_ids"]]
    return [str(s.sample_id) for s in samples]


def _forward_loss(model, kind: str, batch: dict, device: str):
    """Token-mean loss of one step (fp32 scalar) and its loss-token count."""
    from seqpack.hf import packed_forward
    from seqpack.loss import packed_cross_entropy

    if kind == "padded":
        out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                    position_ids=batch["position_ids"].to(device), use_cache=False)
    else:
        out = packed_forward(model, batch, compute_loss=False)
    loss_sum, count = packed_cross_entropy(out.logits, batch["labels"])
    return loss_sum / count.clamp(min=1), int(count)


@dataclass
class _ModeRun:
    name: str
    model: Any
    opt: Any
    steps: list[np.ndarray]
    rows: list[Any] | None = None
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    real: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    loss_tokens: list[int] = field(default_factory=list)
    ids: list[list[str]] = field(default_factory=list)


def run_training(samples: Sequence[Any] | None = None, cfg: TrainConfig | None = None, *, pad_token_id: int = 0,
                 log: Callable[[str], None] = print,
                 option_names: dict[str, str] | None = None) -> dict[str, Any]:
    """Train every mode of ``cfg.modes`` on the same samples and compare loss and throughput.

    Args:
        samples: ``Sample`` objects (``None``: :func:`default_data` through ``seqpack.data.prepare``
            with the embedded Qwen3 tokenizer; then ``pad_token_id`` comes from the tokenizer).
        cfg: :class:`TrainConfig` (default settings when ``None``).
        pad_token_id: id of padding slots (ignored when ``samples`` is None).
        log: one-line messages (data summary, warnings, steps actually run, a note when ``modes`` is
            ``("padded",)`` alone: nothing to compare, so no loss check and no speed-up; and one
            ``wrote <path>`` line per file written: ``train.json``, ``train_loss.png``,
            ``train_throughput.png``).
        option_names: how messages name config fields (``seqpack train`` passes :data:`CLI_OPTION_NAMES`).
            When given, a fix only advises fields it names (a caller without a ``warmup_steps`` option
            is told to raise ``steps``, not to lower ``warmup_steps``).

    Before any data is read or model built: :meth:`TrainConfig.validate`, :func:`check_runtime`
    (model, device, attention) and :func:`check_out_dir`.

    Returns:
        the ``train.json`` payload: ``config``, ``data`` (samples, tokens, steps), ``modes`` (per mode:
        ``losses``, ``step_time_s``, ``real_tokens``, ``slot_tokens``, ``padding_fraction``,
        ``real_tokens_per_s``, ``slot_tokens_per_s``, ``reference``, ``speedup_vs_reference``,
        ``ideal_ratio``, ``fraction_of_ideal``, ``max_abs_loss_delta``), ``goals`` (each ``goal``,
        ``pass`` (``None`` = no verdict), ``info``, ``kind``: ``"loss"`` = correctness check,
        ``"speed"`` = informational).

    Raises:
        ValueError: an invalid config field, a device / attention this machine cannot run, an
            unwritable ``out_dir``, no samples, or a sample longer than ``seq_length``.
        FileNotFoundError: ``model`` is neither a tiny name nor an existing folder, or the folder has no
            ``config.json`` or no weights.
    """
    import torch

    cfg = cfg or TrainConfig()
    cfg.validate(option_names)
    check_runtime(cfg, option_names=option_names)
    check_out_dir(cfg.out_dir, option_names=option_names)
    if not cfg.num_threads:
        return _run_training(samples, cfg, pad_token_id, log, option_names)
    before = torch.get_num_threads()
    torch.set_num_threads(int(cfg.num_threads))
    try:
        return _run_training(samples, cfg, pad_token_id, log, option_names)
    finally:
        torch.set_num_threads(before)


def _run_training(samples, cfg: TrainConfig, pad_token_id: int, log: Callable[[str], None],
                  option_names: dict[str, str] | None) -> dict[str, Any]:
    import torch

    n = _namer(option_names)
    modes = list(dict.fromkeys(cfg.modes))
    if "padded" not in modes and ({"packed", "in_batch"} & set(modes)):
        modes.insert(0, "padded")  # their reference; streaming brings its own (padded_stream)
    notes = []  # logged after the overview line
    if modes == ["padded"]:
        notes.append(f"note: {n('modes')} padded alone trains only the baseline (unpacked, padded): no loss-agreement check "
                     f"and no speed-up (add packed, in_batch or streaming to {n('modes')} to compare)")
    if samples is None:
        data = default_data()
        log(f"data: {data}")
        samples, pad_token_id, _ = prepare_data([data], cfg, option_names=option_names, log=log)
    samples = list(samples)[: cfg.max_samples]
    if not samples:
        raise ValueError("no samples to train on")
    too_long = [s.sample_id for s in samples if s.length > cfg.seq_length]
    if too_long:
        raise ValueError(f"{len(too_long)} sample(s) longer than {n('seq_length')} {cfg.seq_length} (first: "
                         f"{too_long[0]}); prepare them with the same seq_length (overlength='truncate')")
    with_images = sum(1 for s in samples if s.media and s.media.get("images"))
    if with_images:
        log(f"warning: {with_images} of {len(samples)} samples have images; seqpack train trains text-only models, "
            "so the images are ignored and their placeholder text (e.g. <image>) is trained as ordinary tokens "
            "(the mode comparison still holds: every mode sees the same tokens)")
    vocab = None
    if cfg.model in TINY_MODELS:
        if cfg.compact_vocab:
            samples, vocab, pad_token_id = compact_vocabulary(samples, pad_token_id)
        else:
            vocab = int(max(int(np.max(s.input_ids)) for s in samples) + 1)
            vocab = max(vocab, pad_token_id + 1, cfg.vocab_size or 0)
    lengths = np.array([s.length for s in samples], np.int64)
    plan = plan_steps(lengths, cfg.seq_length, algorithm=cfg.algorithm, seed=cfg.seed)
    n_steps = len(plan) if cfg.steps is None else min(cfg.steps, len(plan))
    if cfg.steps is not None and n_steps < cfg.steps:
        notes.append(f"{n('steps')} {cfg.steps}: the {len(samples)} samples fill only {len(plan)} pack(s) of <= "
                     f"{cfg.seq_length} tokens, so {n_steps} step(s) are run per mode (more data or a smaller "
                     f"{n('seq_length')} gives more packs)")
    plan = plan[:n_steps]

    from seqpack.packed import build_packed_sequence

    base = build_model(cfg, vocab)
    rows_in = base.get_input_embeddings().num_embeddings
    top = max(int(np.max(s.input_ids)) for s in samples)
    if max(top, pad_token_id) >= rows_in:
        raise ValueError(f"token id {max(top, pad_token_id)} (data or pad id) is past the model's {rows_in:,} "
                         f"embedding rows ({n('model')} {cfg.model}). Fix: prepare the data with the model's own "
                         f"tokenizer ({n('tokenizer')})")
    runs: list[_ModeRun] = []

    def new_run(name: str, steps: list[np.ndarray], rows=None) -> _ModeRun:
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        return _ModeRun(name, model, opt, steps, rows)

    for m in modes:
        if m == "streaming":
            from seqpack.stream import StreamingPacker

            packer = StreamingPacker(samples, cfg.seq_length, packing_buffer_size=min(cfg.packing_buffer_size,
                                     len(samples)), pad_token_id=pad_token_id, seed=cfg.seed, output="packed")
            index = {s.sample_id: i for i, s in enumerate(samples)}
            rows, steps = [], []
            for row in packer:  # the packer's own packs, in its order (built before the timed loop)
                rows.append(row)
                steps.append(np.array([index[str(sid)] for sid in row.sample_ids], np.int64))
                if len(rows) == n_steps:
                    break
            if len(rows) < n_steps:
                notes.append(f"streaming: the packer made only {len(rows)} pack(s), so streaming and padded_stream "
                             f"run {len(rows)} step(s) (the other modes {n_steps})")
            runs.append(new_run("streaming", steps, rows))
            runs.append(new_run("padded_stream", steps))
        elif m == "packed":
            rows = [build_packed_sequence([samples[int(i)] for i in b], pad_token_id=pad_token_id) for b in plan]
            runs.append(new_run("packed", plan, rows))
        else:
            runs.append(new_run(m, plan))
    del base
    longest = max(len(r.steps) for r in runs)
    if cfg.warmup_steps >= longest:
        warm = (f"{n('warmup_steps')} {cfg.warmup_steps}" if _settable(option_names, "warmup_steps")
                else f"the warm-up of {cfg.warmup_steps} step(s)")
        notes.append(f"{warm} is not below the {longest} step(s) run: only the first "
                     f"{longest - 1} step(s) are left out of the throughput (a speed verdict needs "
                     f"{MIN_TIMED_STEPS} timed steps: {_timed_steps_fix(option_names)})")
    total = sum(len(r.steps) for r in runs)
    log(f"{len(samples)} samples, {int(lengths.sum()):,} tokens; {n_steps} steps of <= {cfg.seq_length} tokens; "
        f"modes: {', '.join(r.name for r in runs)}; model {cfg.model} (vocab {vocab or 'model'}), "
        f"{cfg.attn_implementation}, {cfg.dtype}, {cfg.device}")
    for note in notes:
        log(note)

    from contextlib import nullcontext

    if cfg.progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        prog = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                        TimeElapsedColumn(), transient=False)
    else:
        prog = None
    amp = (torch.autocast(device_type=cfg.device.split(":")[0], dtype=getattr(torch, cfg.autocast_dtype))
           if cfg.autocast_dtype else nullcontext())
    with (prog if prog is not None else nullcontext()):
        task = prog.add_task("", total=total) if prog else None
        for k in range(max(len(r.steps) for r in runs)):
            order = runs[k % len(runs):] + runs[: k % len(runs)]  # rotate: no mode always runs first
            for r in order:
                if k >= len(r.steps):
                    continue
                ss = [samples[int(i)] for i in r.steps[k]]
                _sync(cfg.device)
                t0 = time.perf_counter()
                kind, batch, slots = _step_inputs(r.name, ss, r.rows[k] if r.rows else None, pad_token_id)
                with amp:
                    loss, count = _forward_loss(r.model, kind, batch, cfg.device)
                loss.backward()
                r.opt.step()
                r.opt.zero_grad(set_to_none=True)
                _sync(cfg.device)
                r.times.append(time.perf_counter() - t0)
                r.losses.append(float(loss.detach()))
                r.real.append(int(sum(s.length for s in ss)))
                r.slots.append(slots)
                r.loss_tokens.append(count)
                r.ids.append(_batch_sample_ids(kind, batch, ss))
                if prog:
                    prog.update(task, advance=1, description=(
                        f"{r.name:>13s} step {k + 1} loss {r.losses[-1]:.4f} "
                        f"{r.real[-1] / r.times[-1]:,.0f} real tok/s, pad {1 - r.real[-1] / r.slots[-1]:.1%}"))
    return _summarise(runs, cfg, samples, lengths, n_steps, vocab, log, option_names)


def _summarise(runs: list[_ModeRun], cfg: TrainConfig, samples, lengths, n_steps, vocab, log,
               option_names: dict[str, str] | None) -> dict[str, Any]:
    from rich.console import Console

    from seqpack.bench.timing import bar_chart, line_chart, print_table, verdict, write_json

    n = _namer(option_names)
    fix_timed = _timed_steps_fix(option_names)
    by = {r.name: r for r in runs}
    w = max(0, min(cfg.warmup_steps, max(len(r.steps) for r in runs) - 1))
    out: dict[str, Any] = {}
    for r in runs:
        t = float(sum(r.times[w:]))
        real, slots = int(sum(r.real[w:])), int(sum(r.slots[w:]))
        out[r.name] = {
            "steps": len(r.losses), "losses": r.losses, "step_time_s": r.times, "real_tokens": real,
            "slot_tokens": slots, "loss_tokens": int(sum(r.loss_tokens)),
            "padding_fraction": round(1.0 - real / slots, 6) if slots else None,
            "time_s": t, "real_tokens_per_s": real / t if t else None, "slot_tokens_per_s": slots / t if t else None,
        }
    goals = []
    for r in runs:
        if r.name in ("padded", "padded_stream"):
            continue
        ref = by["padded_stream" if r.name == "streaming" else "padded"]
        o, ro = out[r.name], out[ref.name]
        same = len(r.ids) == len(ref.ids) and all(sorted(a) == sorted(b) for a, b in zip(r.ids, ref.ids))
        o["reference"] = ref.name
        o["same_samples_as_reference"] = bool(same)
        o["speedup_vs_reference"] = ro["time_s"] / o["time_s"] if o["time_s"] else None
        o["ideal_ratio"] = ro["slot_tokens"] / o["real_tokens"] if o["real_tokens"] else None
        o["fraction_of_ideal"] = (o["speedup_vs_reference"] / o["ideal_ratio"]) if o["ideal_ratio"] else None
        d = np.abs(np.array(r.losses) - np.array(ref.losses[: len(r.losses)]))
        o["max_abs_loss_delta"] = float(d.max()) if d.size else None
        o["loss_delta_step1"] = float(d[0]) if d.size else None
        loss_goal = verdict(f"{r.name}: loss curve = {ref.name} within {cfg.loss_tolerance:g} (token mean, same samples)",
                            bool(same) and o["max_abs_loss_delta"] <= cfg.loss_tolerance,
                            f"max |delta| {o['max_abs_loss_delta']:.2e} over {len(r.losses)} steps "
                            f"(step 1: {o['loss_delta_step1']:.2e})"
                            + ("" if same else "; the steps did not hold the same samples"))
        goals.append(loss_goal | {"kind": "loss"})
        label = f"{r.name}: speed-up >= 90% of ideal"
        timed = min(len(r.times), len(ref.times)) - w
        if timed < MIN_TIMED_STEPS or o["fraction_of_ideal"] is None:
            info = (f"not enough timed steps for a speed verdict ({timed} after {w} warm-up; need >= "
                    f"{MIN_TIMED_STEPS}: {fix_timed})")
            Console().print(f"[yellow]n/a[/]   {label}: {info}", highlight=False)
            goals.append({"goal": label, "pass": None, "info": info, "kind": "speed"})
        else:
            goals.append(verdict(label, o["fraction_of_ideal"] >= 0.9,
                                 f"{o['speedup_vs_reference']:.2f}x vs ideal {o['ideal_ratio']:.2f}x = "
                                 f"{100 * o['fraction_of_ideal']:.0f}% (informational: step times are noisy)")
                         | {"kind": "speed"})
    rows = []
    for r in runs:
        o = out[r.name]
        rows.append([r.name, o["steps"], o["real_tokens"], o["slot_tokens"], o["padding_fraction"],
                     o["real_tokens_per_s"], o["slot_tokens_per_s"], o.get("speedup_vs_reference"),
                     o.get("ideal_ratio"), o.get("fraction_of_ideal"), o.get("max_abs_loss_delta"), r.losses[-1]])
    print_table(f"train: {cfg.model}, {cfg.attn_implementation}, {cfg.dtype}, {cfg.device}; throughput after "
                f"{w} warm-up step(s) (token counts and rates: timed steps only)",
                ["mode", "steps (all)", "real tok (timed)", "slot tok (timed)", "pad frac", "real tok/s", "slot tok/s",
                 "speed-up",
                 "ideal", "of ideal", "max |dloss|", "last loss"], rows)
    payload = {
        "benchmark": "train",
        "config": {k: (list(v) if isinstance(v, (tuple, list)) else v) for k, v in asdict(cfg).items()},
        "data": {"samples": len(samples), "tokens": int(lengths.sum()), "steps": n_steps, "vocab_size": vocab},
        "loss": "token mean of cross entropy over each step's loss tokens (seqpack.loss.packed_cross_entropy)",
        "modes": out,
        "goals": goals,
    }
    if cfg.out_dir:
        od = Path(cfg.out_dir)
        written = [write_json(od / "train.json", payload)]
        written.append(line_chart(od / "train_loss.png", {r.name: r.losses for r in runs},
                                  title="loss per step (token mean, same samples per step)", xlabel="step",
                                  ylabel="loss (nats)"))
        names = [r.name for r in runs]
        written.append(bar_chart(od / "train_throughput.png", names, [out[m]["real_tokens_per_s"] for m in names],
                                 title="real tokens / s (higher is better)", ylabel="tokens/s",
                                 annotate=[f"{out[m]['real_tokens_per_s']:.0f}" for m in names]))
        for path in written:
            log(f"wrote {path}")
    return payload
