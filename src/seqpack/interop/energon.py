"""Megatron-Energon: a ``TaskEncoder`` mixin that packs with seqpack and keeps Energon's loader state restorable.

Mix :class:`SeqpackPackingMixin` in front of an Energon task encoder and pass ``packing_buffer_size`` to
``get_train_dataset``::

    from megatron.energon import DefaultTaskEncoder
    from seqpack.interop.energon import SeqpackPackingMixin

    class PackingEncoder(SeqpackPackingMixin, DefaultTaskEncoder):
        seq_length, pad_token_id = 4096, 151643

Energon then runs, per worker: ``encode_sample`` (raw sample -> :class:`SeqpackSample`), the packing
buffer (``select_samples_to_pack``: seqpack's packing algorithm), ``pack_selected_samples`` (the one row
builder -> :class:`SeqpackPack`) and ``batch`` (:class:`~seqpack.collate.PackedCollator` -> one THD batch
dict). Every item here carries the Energon metadata of the samples it holds (``__key__``,
``__restore_key__``, ``__subflavors__``, ``__sources__``), as Energon's own packing does. Energon saves its
shuffle and packing buffers as the ``__restore_key__`` of the encoded samples in them and rebuilds them
by re-running the stateless steps (cooker, ``encode_sample``) on the raw samples those keys name, so an
encoded sample without the raw sample's key cannot be restored; a pack's or batch's key rebuilds that
one item (``loader.restore_sample(batch["__restore_key__"])``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from megatron.energon import Sample as EnergonSample
    from megatron.energon import stateless
    from megatron.energon.edataclass import edataclass
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise ImportError(
        "seqpack.interop.energon needs Megatron-Energon: pip install megatron-energon (tested with 7.4.1)"
    ) from e

from seqpack.collate import PackedCollator
from seqpack.collate.output import check_label_convention, feature_sample, feature_value
from seqpack.packed import PackedSequence
from seqpack.sample import Sample
from seqpack.stream.hooks import pack_selected_samples, select_samples_to_pack

__all__ = ["ENERGON_KEYS", "SeqpackPack", "SeqpackPackingMixin", "SeqpackSample"]

#: the Energon metadata keys a batch dict carries besides the collator's output (strip them before
#: ``model(**batch)``)
ENERGON_KEYS = ("__key__", "__restore_key__", "__subflavors__", "__sources__")


@edataclass
class SeqpackSample(EnergonSample):
    """One tokenized sample inside Energon's pipeline: Energon's metadata plus a seqpack ``Sample``.

    Attributes:
        sample: the :class:`~seqpack.sample.Sample` (int32 ``input_ids`` / shifted ``labels`` ``[L]``,
            ``sample_id`` = the raw sample's ``__key__``).
    """

    sample: Sample

    @property
    def sample_id(self) -> str:
        """The seqpack sample's id (the raw sample's ``__key__``), named in seqpack's errors."""
        return self.sample.sample_id


@edataclass
class SeqpackPack(EnergonSample):
    """One packed row inside Energon's pipeline (what ``pack_selected_samples`` returns).

    ``__key__`` joins the segments' keys with ``","``; ``__restore_key__`` is set by Energon's
    ``PackingDataset`` (the pack index and each segment's restore key).

    Attributes:
        packed: the :class:`~seqpack.packed.PackedSequence` row (``validate()`` holds).
    """

    packed: PackedSequence


def _sources(items: Sequence[Any]) -> tuple | None:
    """The items' ``__sources__`` flattened in order (``Batch.from_samples``' rule), None when none has any."""
    if all(getattr(s, "__sources__", None) is None for s in items):
        return None
    return tuple(src for s in items for src in (s.__sources__ or ()))


class SeqpackPackingMixin:
    """Packing hooks for an Energon ``TaskEncoder``; put it first in the bases.

    Settings (class attributes, or set them in ``__init__``):
        seq_length: tokens per packed row (required; divisible by ``pad_to_multiple_of``).
        pad_token_id: id written into padding slots (required; the tokenizer's ``pad_token_id``).
        pad_to_multiple_of: per-segment physical length multiple (default 1; with context parallelism the
            multiple from :func:`seqpack.padding.compute_pad_multiple`).
        pad_to_max_length: pad every row to ``seq_length`` (static shapes; default False).
        algorithm: a :class:`~seqpack.algorithms.PackingAlgorithm` or its name; None = seqpack's default.
        overlength: ``"error"`` (default) refuses a sample longer than ``seq_length``; ``"drop"`` drops it
            and logs a warning (:func:`seqpack.stream.select_samples_to_pack`).
        label_convention: how stored ``labels`` are meant: ``"shifted"`` (seqpack's, default) or
            ``"hf"`` (unshifted, HF collators); samples without labels train on every next token.
        collate_format, model_config: :class:`~seqpack.collate.PackedCollator`'s ``format``
            (``"thd"`` default, ``"hf"``, ``"megatron"``) and, for ``"hf"``, the model's config
            (``config=``: the masks follow its attention pattern).

    Hooks (Energon calls them; all but ``select_samples_to_pack`` are ``@stateless``, which restoring a
    saved loader state requires; none draws random numbers, so no ``restore_seeds`` is needed):
        encode_sample: a raw sample carrying token ids (``input_ids``, optionally ``labels``, as attributes
            or keys) -> :class:`SeqpackSample`. Data that needs tokenizing: override it, decorate it with
            ``@stateless`` and return ``self.seqpack_sample(sample, input_ids, labels)``.
        select_samples_to_pack: the buffer -> groups, by seqpack's packing algorithm (deterministic).
        pack_selected_samples: a group -> :class:`SeqpackPack` (the one row builder).
        batch: packs -> the collator's batch dict (``input_ids``, ``labels``, ``cu_seqlens``, ... of one THD
            row; :func:`seqpack.hf.packed_forward` takes it as is) plus :data:`ENERGON_KEYS`:
            ``__key__`` (list of the packs' keys), ``__restore_key__`` (set by Energon's ``BatchDataset``),
            ``__subflavors__`` (list, per pack) and ``__sources__``.

    A seqpack refusal (over-length sample, bad settings, a raw sample without ``input_ids``) is fatal at
    the first failure (``failure_tolerance=1``): Energon's default error handler would otherwise log it
    and skip the whole buffer.
    """

    seq_length: int
    pad_token_id: int
    pad_to_multiple_of: int = 1
    pad_to_max_length: bool = False
    algorithm: Any = None
    overlength: str = "error"
    label_convention: str = "shifted"
    collate_format: str = "thd"
    model_config: Any = None

    def seqpack_sample(self, sample: Any, input_ids: Any, labels: Any = None) -> SeqpackSample:
        """``sample``'s Energon metadata with the seqpack ``Sample`` of ``input_ids`` / ``labels``.

        Args:
            sample: the raw Energon sample (a ``Sample`` dataclass or a crude dict); its ``__key__`` becomes
                the ``sample_id``, its ``__restore_key__`` / ``__subflavors__`` / ``__sources__`` are kept.
            input_ids: int ``[L]`` (list, numpy array or CPU tensor), ``L >= 1``.
            labels: int ``[L]`` in :attr:`label_convention`, or None (train on every next token).

        Raises:
            KeyError, ValueError: from :func:`seqpack.collate.output.feature_sample` (no ids, empty
                sample, labels of another length); ``label_convention`` unknown.
        """
        check_label_convention(self.label_convention)
        key = feature_value(sample, "__key__")
        s = feature_sample({"input_ids": input_ids, "labels": labels, "sample_id": key}, self.label_convention, 0)
        return SeqpackSample(
            __key__=key,
            __restore_key__=feature_value(sample, "__restore_key__", ()),
            __subflavors__=feature_value(sample, "__subflavors__"),
            __sources__=feature_value(sample, "__sources__"),
            sample=s,
        )

    @stateless(failure_tolerance=1)
    def encode_sample(self, sample: Any) -> SeqpackSample:
        """A raw sample that already carries token ids -> :class:`SeqpackSample` (``input_ids``, optional
        ``labels``; attributes or keys). Raises KeyError naming the sample when it has no ``input_ids``."""
        if feature_value(sample, "input_ids") is None:
            raise KeyError(
                f"sample {feature_value(sample, '__key__')!r} has no input_ids; override encode_sample "
                "(decorated @stateless) to tokenize and return self.seqpack_sample(sample, input_ids, labels)"
            )
        return self.seqpack_sample(sample, feature_value(sample, "input_ids"), feature_value(sample, "labels"))

    @stateless(failure_tolerance=1)
    def select_samples_to_pack(self, samples: list[SeqpackSample]) -> list[list[SeqpackSample]]:
        """The packing buffer -> groups of at most ``seq_length`` tokens (after pad rounding); a pure
        function of the buffer (Energon saves the groups' restore keys, not this call)."""
        return select_samples_to_pack(
            samples, capacity=self.seq_length, algorithm=self.algorithm,
            pad_to_multiple_of=self.pad_to_multiple_of, length_fn=lambda s: s.sample.length,
            overlength=self.overlength,
        )

    @stateless(failure_tolerance=1)
    def pack_selected_samples(self, samples: list[SeqpackSample]) -> SeqpackPack:
        """One group -> :class:`SeqpackPack` (segments in group order; Energon sets ``__restore_key__``)."""
        row = pack_selected_samples(
            [s.sample for s in samples], pad_token_id=self.pad_token_id,
            pad_to_multiple_of=self.pad_to_multiple_of, seq_length=self.seq_length,
            pad_to_max_length=self.pad_to_max_length,
        )
        return SeqpackPack(
            __key__=",".join(s.__key__ for s in samples),
            __restore_key__=(),
            __subflavors__=samples[0].__subflavors__,
            __sources__=_sources(samples),
            packed=row,
        )

    @stateless(failure_tolerance=1)
    def batch(self, samples: list[SeqpackPack]) -> dict[str, Any]:
        """Packs -> :class:`~seqpack.collate.PackedCollator`'s batch (one THD row) plus :data:`ENERGON_KEYS`."""
        out = PackedCollator(format=self.collate_format, config=self.model_config)(
            [s.packed for s in samples]
        )
        out.update(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            __subflavors__=[s.__subflavors__ for s in samples],
            __sources__=_sources(samples),
        )
        return out
