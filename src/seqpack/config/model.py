"""``PackingConfig``: every setting that decides how sequences are packed, in one pydantic model.

Field names are the ones Megatron-Core / Megatron-Bridge / HF users already know
(``seq_length``, ``micro_batch_size``, ``context_parallel_size``, ``calculate_per_token_loss`` ...);
a few common spellings from other stacks are accepted as aliases on input (``pad_seq_to_mult``,
``packed_sequence_size``, ``enable_cuda_graph``, ``packed_metadata``). Construction checks types and
ranges, strictly for numbers and on/off keys (``seq_length: "4096"`` is text, not an integer; ``true`` is
no number; ``"yes"`` is no boolean: the values a packed dataset's metadata records are checked as strictly); :meth:`PackingConfig.validate` checks the cross-key rules and raises ONE
:class:`~seqpack.config.errors.ConfigValidationError` listing every violation.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
import numbers
from typing import Annotated, Any

import yaml
from pydantic import (AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt,
                      ValidationError, field_validator, model_validator)
from pydantic_core import PydanticCustomError

from seqpack.algorithms import resolve_algorithm
from seqpack.config.errors import ConfigValidationError, Violation
from seqpack.config.options import (
    ALGORITHM_VALUES,
    DEFAULT_ALGORITHM_VALUE,
    TRAIN_ON_VALUES,
    AttentionBackend,
    PackingMode,
)
from seqpack.config.parse import parse_file
from seqpack.config.packed_data import PackedDataCheck, check_packed_data, pack_options
from seqpack.config.registry import ModelFamily, load_registry
from seqpack.config.rules import run_rules
from seqpack.config.schema import schema_and_rule_violations
from seqpack.padding import compute_pad_multiple

__all__ = ["ALGORITHM_VALUES", "TRAIN_ON_VALUES", "AttentionBackend", "PackedDataCheck", "PackingConfig",
           "PackingMode"]


def _plain_int(value: Any) -> Any:
    """A numpy integer as a Python int (a config built from arrays); text, floats and booleans stay as given, so
    the strict check refuses them."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and not isinstance(value, int):
        return int(value)
    return value


# an integer key: Python or numpy integers; not "4096", 4096.0 or true
Int = Annotated[StrictInt, BeforeValidator(_plain_int)]


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class PackingConfig(BaseModel):
    """Packing settings plus the parallel/loss/model settings that constrain them.

    Lengths are in tokens. Defaults follow Megatron-Core where a field comes from there
    (``calculate_per_token_loss=False``, ``average_in_collective=True``), so a config that only
    works with non-default loss settings says so at validation time.

    Raises (on construction or assignment):
        pydantic.ValidationError: wrong type or out-of-range value; unknown key. Use the
            ``from_*`` loaders to get a :class:`ConfigValidationError` instead.
    """

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, populate_by_name=True, use_enum_values=False
    )

    # --- recipe metadata (ignored by the rules) ---
    recipe: str | None = Field(None, description="Recipe name when the config comes from a recipe.")
    description: str | None = Field(None, description="Free text describing the config.")

    # --- packing ---
    packing: PackingMode = Field(
        PackingMode.OFFLINE, validation_alias=_alias("packing", "packing_mode"),
        description="offline | in_batch | streaming | none",
    )
    seq_length: Int = Field(
        4096, ge=1, validation_alias=_alias("seq_length", "capacity", "packed_sequence_size"),
        description="Pack capacity T in tokens (row width).",
    )
    pad_to_multiple_of: Int = Field(
        1, ge=1, validation_alias=_alias("pad_to_multiple_of", "pad_seq_to_mult"),
        description="User multiple every segment is padded to; combined with CP/TP by compute_pad_multiple.",
    )
    pad_to_max_length: StrictBool = Field(False, description="Pad every row to exactly seq_length (static shapes).")
    pad_cu_seqlens: StrictBool = Field(
        False, description="Pad cu_seqlens to a fixed number of entries (static shapes for CUDA graphs)."
    )
    algorithm: str = Field(DEFAULT_ALGORITHM_VALUE, description="A seqpack.algorithms.PackingAlgorithm value.")
    packing_buffer_size: Int | None = Field(None, ge=1, description="Samples buffered per streaming round.")
    planner_pad_multiple: Int | None = Field(
        None, ge=1,
        description="Pad multiple the bin planner assumes, if set separately; must equal effective_pad_multiple "
        "(case B24: planner/builder pad multiple mismatch).",
    )
    packed_dataset_path: str | None = Field(None, description="Offline packed dataset directory (seqpack.io).")
    packed_metadata_path: str | None = Field(
        None, validation_alias=_alias("packed_metadata_path", "packed_metadata"),
        description="Metadata JSON of the packed dataset (needed by pad_cu_seqlens).",
    )
    tokenizer: str | None = Field(
        None, description="Tokenizer the data is tokenized with: 'qwen3' (embedded), a local folder or a hub id.",
    )
    train_on: str | None = Field(
        None, description="Label convention of the data: 'assistant' (assistant turns only) or 'all'; "
        "None = not checked against stored data.",
    )

    # --- batching ---
    micro_batch_size: Int = Field(1, ge=1)
    global_batch_size: Int | None = Field(None, ge=1)
    data_parallel_size: Int | None = Field(None, ge=1, description="DP world size, if known at setup.")
    dynamic_batching: StrictBool = Field(False, description="Token-budget (dynamic) micro-batches.")
    flatten_micro_batch: StrictBool = Field(
        False, description="Flatten [B, T] in-batch packs into one [1, B*T] THD row with offset boundaries."
    )

    # --- parallelism ---
    context_parallel_size: Int = Field(1, ge=1)
    tensor_model_parallel_size: Int = Field(1, ge=1)
    sequence_parallel: StrictBool = False
    pipeline_model_parallel_size: Int = Field(1, ge=1)
    expert_model_parallel_size: Int = Field(1, ge=1)

    # --- loss ---
    finetuning: StrictBool = Field(True, description="Fine-tuning (SFT) rather than pre-training.")
    calculate_per_token_loss: StrictBool = Field(False, description="Megatron-Core: normalise by the global token count.")
    average_in_collective: StrictBool = Field(True, description="Megatron-Core DDP: average (not sum) in the collective.")
    fuse_loss: StrictBool = Field(False, description="Fused (per-token) cross-entropy.")

    # --- model ---
    model_family: str | None = Field(None, description="Registry key or alias (seqpack.config.list_families()).")
    multimodal: StrictBool | None = Field(None, description="Override the registry's modality (None = from model_family).")
    attention_backend: AttentionBackend = AttentionBackend.TE
    attention_varlen: StrictBool | None = Field(
        None, description="Override: the attention path takes segment boundaries under CP (None = from registry)."
    )
    linear_attention_varlen: StrictBool | None = Field(
        None,
        description="The model's linear-attention/SSM kernels (gated delta net, Mamba2) take cu_seqlens/seq_idx.",
    )
    mtp_num_layers: Int = Field(0, ge=0)
    mtp_ready_packing: StrictBool = Field(False, description="Use seqpack.mtp.roll_packed (per-segment MTP roll).")
    num_moe_experts: Int | None = Field(None, ge=1)
    moe_router_enable_expert_bias: StrictBool = False
    moe_aux_loss_coeff: StrictFloat = Field(0.0, ge=0.0)
    produce_padding_mask: StrictBool = Field(False, description="Emit padding_mask (True = pad) for the MoE router.")
    cuda_graphs: StrictBool = Field(False, validation_alias=_alias("cuda_graphs", "enable_cuda_graph"))
    fp8: str | None = Field(None, description="FP8 recipe/format (e.g. 'hybrid', 'e4m3'); None = off.")

    @model_validator(mode="before")
    @classmethod
    def _packing_flags(cls, data: Any) -> Any:
        """Accept Megatron-Bridge's boolean spellings ``packed_sequence`` (offline) and
        ``pack_sequences_in_batch`` (in-batch); the two are mutually exclusive."""
        if not isinstance(data, dict) or not ({"packed_sequence", "pack_sequences_in_batch"} & set(data)):
            return data
        data = dict(data)
        for key in ("packed_sequence", "pack_sequences_in_batch"):
            if not isinstance(data.get(key, False), bool):
                raise PydanticCustomError("packing_flag_type", "{key} must be true or false, got {value}",
                                          {"key": key, "value": repr(data[key])})
        offline = data.pop("packed_sequence", False)
        in_batch = data.pop("pack_sequences_in_batch", False)
        if offline and in_batch:
            raise PydanticCustomError(
                "packing_flags_exclusive",
                "packed_sequence (offline packing) and pack_sequences_in_batch (in-batch packing) are mutually "
                "exclusive",
            )
        mode = "offline" if offline else "in_batch" if in_batch else "none"
        given = data.get("packing", data.get("packing_mode"))
        given = getattr(given, "value", given)
        if given is not None and given != mode:
            raise PydanticCustomError(
                "packing_flags_exclusive",
                "packing '{given}' contradicts the boolean packing flags, which mean packing '{mode}'",
                {"given": given, "mode": mode},
            )
        data.setdefault("packing", mode)
        return data

    @field_validator("algorithm", mode="before")
    @classmethod
    def _check_algorithm(cls, v: Any) -> str:
        return resolve_algorithm(v).value

    @field_validator("train_on", mode="before")
    @classmethod
    def _check_train_on(cls, v: Any) -> str | None:
        if v is None or v in TRAIN_ON_VALUES:
            return v
        raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON_VALUES)} (or null), got {v!r}")

    @field_validator("fp8", mode="before")
    @classmethod
    def _norm_fp8(cls, v: Any) -> str | None:
        if v is None or v is False or (isinstance(v, str) and v.lower() in ("", "none", "false", "off")):
            return None
        if v is True:
            return "e4m3"
        return str(v)

    @field_validator("mtp_num_layers", mode="before")
    @classmethod
    def _none_is_zero(cls, v: Any) -> Any:
        return 0 if v is None else v

    # ------------------------------------------------------------------ derived
    @property
    def effective_pad_multiple(self) -> int:
        """Multiple every packed segment is padded to: :func:`seqpack.padding.compute_pad_multiple`
        of ``pad_to_multiple_of``, ``context_parallel_size``, ``tensor_model_parallel_size`` and
        ``sequence_parallel``. The planner and the row builder both take this one integer (case B24:
        planner/builder pad multiple mismatch)."""
        return compute_pad_multiple(
            self.pad_to_multiple_of,
            self.context_parallel_size,
            self.tensor_model_parallel_size,
            self.sequence_parallel,
        )

    @property
    def family(self) -> ModelFamily | None:
        """The registry :class:`~seqpack.config.registry.ModelFamily`, or None (no/unknown family)."""
        if self.model_family is None:
            return None
        return load_registry().resolve(self.model_family)

    @property
    def is_multimodal(self) -> bool:
        """``multimodal`` if set, else the registry family's modality, else False (text)."""
        if self.multimodal is not None:
            return self.multimodal
        fam = self.family
        return bool(fam and fam.is_multimodal)

    def packed_data_expectations(self) -> dict[str, Any]:
        """Settings that change the tensor contract of stored packed data, for
        ``seqpack.io.load_packed(path, expect=cfg.packed_data_expectations())`` (case B23: stale packed
        data).

        Returns:
            dict with ``capacity`` (= ``seq_length``), ``effective_pad_multiple``,
            ``context_parallel_size`` and, when set, ``train_on``. Keys are names ``load_packed``
            accepts; io compares them by equality. Not included: ``algorithm`` and the user
            ``pad_to_multiple_of`` (they change which samples share a row, not the row contract:
            :meth:`check_packed_data` reports them as notes) and ``tokenizer`` (a name is not an
            identity: :meth:`check_packed_data` compares tokenizers by hash or alias table).
        """
        exp: dict[str, Any] = {
            "capacity": self.seq_length,
            "effective_pad_multiple": self.effective_pad_multiple,
            "context_parallel_size": self.context_parallel_size,
        }
        if self.train_on is not None:
            exp["train_on"] = self.train_on
        return exp

    def check_packed_data(self, path: str | Path | None = None) -> PackedDataCheck:
        """Check a stored packed dataset against this config (case B23: stale packed data); metadata only.

        Violations (the data is stale: the rows do not fit this run's tensor contract):
        ``capacity`` (``seq_length``), ``effective_pad_multiple``, ``context_parallel_size``,
        ``train_on`` (when the config sets it) and the tokenizer identity
        (:func:`seqpack.config.tokenizers.compare_tokenizer`: hashes when the config's tokenizer loads
        offline, else normalised names through an alias table; the message says which).
        Notes (reported, not violations): a different ``algorithm`` or user ``pad_to_multiple_of`` with
        the same effective multiple, and how the tokenizer was compared.

        Args:
            path: the packed dataset directory; default ``packed_dataset_path``.

        Returns:
            :class:`PackedDataCheck` with ``violations`` (``[]`` or one ``stale_packed_data`` listing
            every differing key, or one ``packed_data_unreadable``: missing directory, missing/altered
            shard, unknown format) and ``notes`` (strings). No path at all gives an empty result.
        """
        return check_packed_data(self, path)

    def packed_data_violations(self, path: str | Path | None = None) -> list[Violation]:
        """``check_packed_data(path).violations`` (case B23: stale packed data); ``[]`` when no path is
        set or the data fits.

        Not part of :meth:`validate`, which never touches disk.
        """
        return self.check_packed_data(path).violations

    # ------------------------------------------------------------------ offline packing
    def pack_options(self, *, source: str | None = None) -> dict[str, Any]:
        """The :func:`seqpack.pipeline.pack_dataset` keywords (``seqpack pack --config`` options) this config
        sets: ``seq_length``, ``pad_to_multiple_of`` (:attr:`effective_pad_multiple` when TP/SP raise it;
        ``pack_dataset`` has no TP setting), ``context_parallel_size``, ``algorithm`` and, when set,
        ``tokenizer``, ``train_on``, ``output`` (``packed_dataset_path``). Training-side keys are left out.
        Raises ConfigValidationError: ``packing`` not ``offline`` or ``packing_buffer_size`` set (names the key).
        """
        return pack_options(self, source=source)

    # ------------------------------------------------------------------ validation
    def violations(self) -> list[Violation]:
        """Run every rule (:data:`seqpack.config.rules.RULES`) and return all violations (empty = valid)."""
        return run_rules(self)

    def validate(self, *, source: str | None = None) -> PackingConfig:  # type: ignore[override]
        """Check every cross-key rule at once.

        Returns:
            self, so ``cfg = PackingConfig.from_file(p).validate()`` reads naturally.

        Raises:
            ConfigValidationError: one error listing every violation (keys, problem, fix).
        """
        found = self.violations()
        if found:
            raise ConfigValidationError(found, source=source)
        return self

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> PackingConfig:
        """Build from a mapping; schema problems become one :class:`ConfigValidationError`.

        Raises:
            ConfigValidationError: unknown keys (with a did-you-mean), wrong types or ranges.
        """
        if not isinstance(data, Mapping):
            raise ConfigValidationError(
                [Violation("schema", ("<root>",), f"expected a mapping of config keys, got {type(data).__name__}",
                           "write the config as `key: value` pairs (see `seqpack recipe qwen3_sft`)")],
                source=source,
            )
        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise ConfigValidationError(schema_and_rule_violations(cls, data, e), source=source) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> PackingConfig:
        """Load a YAML file (a flat mapping of config keys). Raises ConfigValidationError."""
        p = Path(path)
        data = parse_file(p, "YAML")
        return cls.from_dict(data if data is not None else {}, source=str(p))

    @classmethod
    def from_json(cls, path: str | Path) -> PackingConfig:
        """Load a JSON file (an object of config keys). Raises ConfigValidationError."""
        p = Path(path)
        return cls.from_dict(parse_file(p, "JSON"), source=str(p))

    @classmethod
    def from_file(cls, path: str | Path) -> PackingConfig:
        """Load ``.yaml``/``.yml`` or ``.json`` by suffix.

        Raises:
            IsADirectoryError: ``path`` is a folder (a packed dataset, a recipe folder), not a file.
            FileNotFoundError: no such file.
            ConfigValidationError: unsupported suffix, parse or schema problems.
        """
        p = Path(path)
        if p.is_dir():
            raise IsADirectoryError(f"config {p} is a folder, not a file; pass a .yaml/.yml/.json config file")
        if not p.is_file():
            raise FileNotFoundError(f"config file not found: {p}")
        suffix = p.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return cls.from_yaml(p)
        if suffix == ".json":
            return cls.from_json(p)
        raise ConfigValidationError(
            [Violation("parse", ("<file>",), f"unsupported config file type {suffix!r}",
                       "use a .yaml, .yml or .json file")],
            source=str(p),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with enum values as strings (round-trips through :meth:`from_dict`)."""
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """YAML text of :meth:`to_dict`, keys in field order."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
