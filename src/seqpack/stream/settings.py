"""The settings of a :class:`~seqpack.stream.StreamingPacker`: one typed object, checked once.

:class:`PackerSettings` holds every knob under the field's own name (``seq_length``,
``packing_buffer_size``, ``pad_to_multiple_of``, ``rank``, ``world_size`` ...). Its
:meth:`~PackerSettings.fingerprint` is the plain dict a saved state carries, so that a state saved
under other settings is refused with every differing key named (:func:`check_same_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqpack.stream.hooks import check_capacity

__all__ = ["OUTPUTS", "STREAM_DEFAULT_ALGORITHM", "PackerSettings", "check_same_settings"]

#: The packer's default algorithm. Best-fit decreasing leaves the slack of a round in its last few
#: packs, which carry-over can then refill; "balanced" algorithms spread the slack over every pack,
#: so nothing falls under ``carry_fill`` and carry-over cannot help (measured in bench_stream.py).
STREAM_DEFAULT_ALGORITHM = "best_fit_decreasing"

#: what the packer yields: PackedSequence rows, lists of source items, or int64 arrays of source keys
OUTPUTS = ("packed", "samples", "indices")


@dataclass(frozen=True)
class PackerSettings:
    """Validated settings of one packer (arguments of :class:`~seqpack.stream.StreamingPacker`).

    ``seq_length`` is the packer's ``capacity`` argument (tokens per row); ``algorithm`` is the
    resolved name (``PackingAlgorithm`` value or ``callable:module.qualname``); ``rank`` and
    ``world_size`` are already resolved (no ``None``). Values are coerced to int/float/bool.

    Raises:
        ValueError: the first bad value, named (``capacity`` not divisible by ``pad_to_multiple_of``,
            ``packing_buffer_size < 1``, unknown ``overlength``/``output``, ``carry_fill`` outside
            [0, 1], ``carry_fraction`` outside [0, 1), ``max_wait < 0``, ``rank`` outside
            ``[0, world_size)``).
    """

    seq_length: int
    algorithm: str
    rank: int
    world_size: int
    packing_buffer_size: int = 1000
    pad_to_multiple_of: int = 1
    pad_token_id: int = 0
    pad_to_max_length: bool = False
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    overlength: str = "error"
    output: str = "packed"
    carry_fill: float = 0.999
    carry_fraction: float = 0.3
    max_wait: int = 8
    shard_source: bool = True

    def __post_init__(self) -> None:
        check_capacity(self.seq_length, self.pad_to_multiple_of)
        b = self.packing_buffer_size
        if int(b) != b or b < 1:
            raise ValueError(f"packing_buffer_size must be an integer >= 1, got {b!r}")
        if self.overlength not in ("error", "drop"):
            raise ValueError(f"overlength must be 'error' or 'drop', got {self.overlength!r}")
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if not 0.0 <= self.carry_fill <= 1.0:
            raise ValueError(f"carry_fill must be in [0, 1], got {self.carry_fill!r}")
        if not 0.0 <= self.carry_fraction < 1.0:
            raise ValueError(f"carry_fraction must be in [0, 1), got {self.carry_fraction!r}")
        if int(self.max_wait) != self.max_wait or self.max_wait < 0:
            raise ValueError(f"max_wait must be an integer >= 0, got {self.max_wait!r}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        for name, kind in (("seq_length", int), ("packing_buffer_size", int), ("pad_to_multiple_of", int),
                           ("pad_token_id", int), ("pad_to_max_length", bool), ("seed", int), ("shuffle", bool),
                           ("rank", int), ("world_size", int), ("drop_last", bool), ("carry_fill", float),
                           ("carry_fraction", float), ("max_wait", int), ("shard_source", bool)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    def fingerprint(self, *, worker_id: int, num_workers: int, source_len: int | None) -> dict[str, Any]:
        """The settings that decide which packs are emitted, as a saved state stores them.

        Args:
            worker_id, num_workers: this DataLoader worker (0, 1 in the main process).
            source_len: ``len(source)`` of a map-style source; ``None`` for a plain iterable.

        Returns:
            a plain dict (``torch.save`` with ``weights_only`` loads it). Key names are the saved
            format of ``STATE_VERSION`` 1: ``seq_length`` is stored as ``"capacity"``.
        """
        cfg: dict[str, Any] = {
            "capacity": self.seq_length,
            "packing_buffer_size": self.packing_buffer_size,
            "algorithm": self.algorithm,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "rank": self.rank,
            "num_workers": num_workers,
            "worker_id": worker_id,
            "drop_last": self.drop_last,
            "overlength": self.overlength,
            "carry_fill": self.carry_fill,
            "carry_fraction": self.carry_fraction,
            "max_wait": self.max_wait,
            "source_kind": "iterable" if source_len is None else "map",
            "shard_source": self.shard_source,
        }
        if source_len is not None:
            cfg["source_len"] = source_len
        return cfg


def check_same_settings(saved: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse to resume when two :meth:`PackerSettings.fingerprint` dicts differ.

    Raises:
        ValueError: naming every differing key with both values (``key: saved X vs now Y``).
    """
    diff = sorted(k for k in set(now) | set(saved) if now.get(k) != saved.get(k))
    if diff:
        detail = ", ".join(f"{k}: saved {saved.get(k)!r} vs now {now.get(k)!r}" for k in diff)
        raise ValueError(
            f"cannot resume: the state was saved under different settings ({detail}); restore with the "
            "same settings or start a fresh run (with DataLoader workers, restore through torchdata's "
            "StatefulDataLoader, which hands every worker its own state)"
        )
