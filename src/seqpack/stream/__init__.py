"""Streaming (producer-side) packing with exact resume.

- :mod:`~seqpack.stream.hooks`: the two Megatron-Energon-style hooks, :func:`select_samples_to_pack`
  and :func:`pack_selected_samples` (stateless, numpy only);
- :mod:`~seqpack.stream.settings`: :class:`PackerSettings`, every setting of a packer, checked once;
- :mod:`~seqpack.stream.buffer`: the carry-over buffer of one shard and its savable state (RNG included);
- :mod:`~seqpack.stream.source`: reading one shard of the source (by key, or in order with replay);
- :mod:`~seqpack.stream.packer`: :class:`StreamingPacker`, the torch ``IterableDataset`` shell.

Importing this package or its hooks does not import torch; ``StreamingPacker`` loads it on first
access. How a round works, determinism, sharding and resume: ``docs/notes/stream.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from seqpack.stream.buffer import STATE_VERSION
from seqpack.stream.hooks import pack_selected_samples, sample_length, select_samples_to_pack
from seqpack.stream.settings import STREAM_DEFAULT_ALGORITHM, PackerSettings

if TYPE_CHECKING:  # pragma: no cover
    from seqpack.stream.packer import StreamingPacker

__all__ = [
    "STATE_VERSION",
    "STREAM_DEFAULT_ALGORITHM",
    "PackerSettings",
    "StreamingPacker",
    "pack_selected_samples",
    "sample_length",
    "select_samples_to_pack",
]


def __getattr__(name: str) -> Any:
    if name == "StreamingPacker":  # torch is imported with the packer, not with the hooks
        from seqpack.stream.packer import StreamingPacker

        return StreamingPacker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
