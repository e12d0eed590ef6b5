"""The closed sets of values a :class:`~seqpack.config.PackingConfig` field may take.

Bottom of ``seqpack.config``: the rules, the packed-data check and the model import these; this
module imports no other module of ``seqpack.config``. The algorithm names and the ``train_on`` values have
their one home where they are used (``seqpack.algorithms``, ``seqpack.data``); they are repeated
here only as tuples of strings for the config schema.
"""

from __future__ import annotations

from enum import Enum

from seqpack.algorithms import DEFAULT_ALGORITHM, PackingAlgorithm
from seqpack.data import TRAIN_ON

__all__ = ["ALGORITHM_VALUES", "DEFAULT_ALGORITHM_VALUE", "TRAIN_ON_VALUES", "AttentionBackend", "PackingMode"]

#: valid ``algorithm`` values (the :class:`~seqpack.algorithms.PackingAlgorithm` names).
ALGORITHM_VALUES: tuple[str, ...] = tuple(a.value for a in PackingAlgorithm)
DEFAULT_ALGORITHM_VALUE: str = DEFAULT_ALGORITHM.value

#: ``train_on`` values of ``seqpack.data.prepare`` (``"assistant"``, ``"all"``).
TRAIN_ON_VALUES: tuple[str, ...] = TRAIN_ON


class PackingMode(str, Enum):
    """Where packing happens.

    - ``offline``: packed once ahead of training and stored (``seqpack pack``; Megatron-Bridge
      ``packed_sequence``); one packed row per micro-batch.
    - ``in_batch``: the collator packs the ``micro_batch_size`` samples of each micro-batch into THD
      (Megatron-Bridge ``pack_sequences_in_batch``, HF padding-free collators).
    - ``streaming``: a buffered producer packs on the fly (``seqpack.stream``).
    - ``none``: one sample per row, padded.
    """

    OFFLINE = "offline"
    IN_BATCH = "in_batch"
    STREAMING = "streaming"
    NONE = "none"


class AttentionBackend(str, Enum):
    """Attention implementation; its boundary support is registry data (``attention_backends``)."""

    TE = "te"
    FLASH = "flash"
    SDPA = "sdpa"
    EAGER = "eager"
    FLEX = "flex"
    LOCAL = "local"
