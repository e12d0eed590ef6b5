"""Model-family registry: what each model family allows for packing, stored as data.

The facts live in ``seqpack/resources/families.yaml`` (package data); this module parses and checks
them once and answers look-ups. Validation rules (:mod:`seqpack.config.rules`) read the registry
instead of branching on family names, so supporting a new family is a data edit plus a test.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

__all__ = [
    "AttentionBackendInfo",
    "AttentionKindInfo",
    "ModelFamily",
    "OptOut",
    "Registry",
    "get_family",
    "list_families",
    "load_registry",
    "PACKING_MODES",
]

#: Every packing mode a config can name (mirrors ``seqpack.config.PackingMode``).
PACKING_MODES = ("offline", "in_batch", "streaming", "none")
_MODALITIES = ("text", "vlm")
_POSITION_TYPES = ("rope", "mrope", "none")


@dataclass(frozen=True)
class OptOut:
    """A documented reason a family does not support some packing modes.

    Attributes:
        modes: the packing modes the opt-out covers.
        reason: why (one sentence, for error messages).
        source: citation (project + file/PR) where the limitation is stated.
    """

    modes: tuple[str, ...]
    reason: str
    source: str


@dataclass(frozen=True)
class ModelFamily:
    """One model family's packing-relevant facts (see ``families.yaml`` for the field meanings)."""

    key: str
    name: str
    modality: str
    position_type: str
    packing_modes: tuple[str, ...]
    attention_kinds: tuple[str, ...]
    moe: bool
    mtp: bool
    opt_outs: tuple[OptOut, ...] = ()
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()

    @property
    def is_multimodal(self) -> bool:
        """True for vision-language families (``modality == "vlm"``)."""
        return self.modality == "vlm"

    def supports(self, mode: str) -> bool:
        """Whether ``mode`` (a packing-mode value) is allowed for this family."""
        return mode in self.packing_modes

    def opt_out_for(self, mode: str) -> OptOut | None:
        """The opt-out entry covering ``mode``, or None."""
        for o in self.opt_outs:
            if mode in o.modes:
                return o
        return None


@dataclass(frozen=True)
class AttentionBackendInfo:
    """Whether an attention backend can take segment boundaries, alone and under context parallelism."""

    key: str
    varlen: bool
    cp_varlen: bool
    note: str = ""
    source: str = ""


@dataclass(frozen=True)
class AttentionKindInfo:
    """A sequence-mixer kind; ``needs_varlen_kernel`` = its own kernel must take segment boundaries."""

    key: str
    needs_varlen_kernel: bool
    note: str = ""


@dataclass(frozen=True)
class Registry:
    """The parsed registry: families, attention backends and attention kinds."""

    families: dict[str, ModelFamily]
    attention_backends: dict[str, AttentionBackendInfo]
    attention_kinds: dict[str, AttentionKindInfo]
    _alias_index: dict[str, str] = field(default_factory=dict, repr=False)

    def resolve(self, name: str) -> ModelFamily | None:
        """Look a family up by key or alias (case-insensitive, ``-``/``.``/space treated as ``_``)."""
        return self.families.get(self._alias_index.get(_norm(name), ""))

    def names(self) -> list[str]:
        """Family keys in registry order."""
        return list(self.families)


def _norm(name: str) -> str:
    return re.sub(r"[\s.\-]+", "_", str(name).strip().lower())


class RegistryError(ValueError):
    """The registry data is malformed or inconsistent (names the family and key)."""


def _req(d: dict, key: str, where: str) -> Any:
    if key not in d:
        raise RegistryError(f"{where}: missing key {key!r}")
    return d[key]


def parse_registry(data: dict[str, Any], *, source: str = "families.yaml") -> Registry:
    """Build and check a :class:`Registry` from the mapping stored in ``families.yaml``.

    Raises:
        RegistryError: unknown modality/position type/packing mode/attention kind, an opt-out mode
            that is also listed as supported, a missing ``none`` mode, or a duplicate alias.
    """
    backends = {
        k: AttentionBackendInfo(k, bool(_req(v, "varlen", f"{source}: attention_backends.{k}")),
                                bool(_req(v, "cp_varlen", f"{source}: attention_backends.{k}")),
                                str(v.get("note", "")), str(v.get("source", "")))
        for k, v in (data.get("attention_backends") or {}).items()
    }
    kinds = {
        k: AttentionKindInfo(k, bool(_req(v, "needs_varlen_kernel", f"{source}: attention_kinds.{k}")),
                             str(v.get("note", "")))
        for k, v in (data.get("attention_kinds") or {}).items()
    }
    families: dict[str, ModelFamily] = {}
    alias_index: dict[str, str] = {}
    for key, v in (_req(data, "families", source) or {}).items():
        where = f"{source}: families.{key}"
        modality = _req(v, "modality", where)
        if modality not in _MODALITIES:
            raise RegistryError(f"{where}.modality: {modality!r} not in {_MODALITIES}")
        pos = _req(v, "position_type", where)
        if pos not in _POSITION_TYPES:
            raise RegistryError(f"{where}.position_type: {pos!r} not in {_POSITION_TYPES}")
        modes = tuple(_req(v, "packing_modes", where))
        bad = [m for m in modes if m not in PACKING_MODES]
        if bad:
            raise RegistryError(f"{where}.packing_modes: unknown mode(s) {bad}; known: {PACKING_MODES}")
        if "none" not in modes:
            raise RegistryError(f"{where}.packing_modes: 'none' (no packing) must always be allowed")
        akinds = tuple(_req(v, "attention_kinds", where))
        bad = [a for a in akinds if a not in kinds]
        if bad:
            raise RegistryError(f"{where}.attention_kinds: unknown kind(s) {bad}; known: {list(kinds)}")
        opt_outs = []
        for i, o in enumerate(v.get("opt_outs") or []):
            ow = f"{where}.opt_outs[{i}]"
            omodes = tuple(_req(o, "modes", ow))
            clash = [m for m in omodes if m in modes]
            if clash:
                raise RegistryError(f"{ow}: mode(s) {clash} are opted out but also listed in packing_modes")
            opt_outs.append(OptOut(omodes, str(_req(o, "reason", ow)).strip(), str(_req(o, "source", ow))))
        unexplained = [m for m in PACKING_MODES if m not in modes and not any(m in o.modes for o in opt_outs)]
        if unexplained:
            raise RegistryError(f"{where}: mode(s) {unexplained} are neither supported nor covered by an opt-out")
        fam = ModelFamily(
            key=key,
            name=str(v.get("name", key)),
            modality=modality,
            position_type=pos,
            packing_modes=modes,
            attention_kinds=akinds,
            moe=bool(v.get("moe", False)),
            mtp=bool(v.get("mtp", False)),
            opt_outs=tuple(opt_outs),
            aliases=tuple(v.get("aliases") or ()),
            sources=tuple(v.get("sources") or ()),
            model_types=tuple(str(m) for m in v.get("model_types") or ()),
        )
        families[key] = fam
        for name in (key, *fam.aliases):
            n = _norm(name)
            if n in alias_index and alias_index[n] != key:
                raise RegistryError(f"{where}: alias {name!r} already names family {alias_index[n]!r}")
            alias_index[n] = key
    return Registry(families, backends, kinds, alias_index)


@functools.lru_cache(maxsize=1)
def load_registry() -> Registry:
    """Load the packaged registry (``seqpack/resources/families.yaml``), parsed once per process."""
    text = resources.files("seqpack").joinpath("resources/families.yaml").read_text(encoding="utf-8")
    return parse_registry(yaml.safe_load(text))


def get_family(name: str) -> ModelFamily:
    """Return the family for a key or alias.

    Raises:
        KeyError: unknown family; the message lists the known keys.
    """
    fam = load_registry().resolve(name)
    if fam is None:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(load_registry().names())}")
    return fam


def list_families() -> list[ModelFamily]:
    """All registered families, in registry order."""
    return list(load_registry().families.values())
