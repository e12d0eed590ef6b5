"""Settings of the reference loop: :class:`TrainConfig`, its bounds, and how messages name its fields."""

from __future__ import annotations

import math
import re
from dataclasses import InitVar, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.algorithms import resolve_algorithm

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
        if self.algorithm is not None:
            try:
                resolve_algorithm(self.algorithm)
            except ValueError as e:
                raise ValueError(f"{n('algorithm')}: {e}") from None
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
