"""Is a stored packed dataset tokenized with the tokenizer a config names? (tokenizer identity, case B23)

A packed dataset's ``metadata.json`` records the tokenizer by name (``tokenizer``) and by content
(``tokenizer_hash``: sha256 of its files; ``chat_template_hash``: sha256 of its chat template), both
from :func:`seqpack.data.tokenizer.tokenizer_fingerprint`. A config names its tokenizer in whatever
spelling its author uses (``qwen3``, ``Qwen/Qwen3-8B``, ``/models/Qwen3-8B``), so comparing names
literally rejects data that is fine. :func:`compare_tokenizer` compares by identity:

1. **Hashes** when the config's tokenizer can be loaded offline (the embedded ``"qwen3"`` or an
   existing local folder): its fingerprint is computed with the same function the writer used and
   compared with the stored hashes. A stored hash of a tokenizer that had no local folder (a hub id
   loaded from the HF cache) is the sha256 of its serialized fast tokenizer; that is compared too.
   When the file hashes differ (e.g. a checkpoint folder whose
   ``tokenizer_config.json`` differs from the embedded copy) but the stored tokenizer can be loaded
   too, the two are the same when their serialized fast tokenizers (vocabulary, merges, normalizer,
   pre-tokenizer, added tokens) and chat templates are identical: then token ids and label masks
   are identical.
2. **Names** otherwise (a hub id such as ``Qwen/Qwen3-8B`` is never downloaded here): both names are
   normalised (lower case, trailing ``/`` removed, a Hugging Face cache snapshot path turned back into
   its repo id, a folder into its base name) and mapped through :data:`TOKENIZER_ALIASES`. The result
   says that only names were compared.

Where the alias table comes from, and what it deliberately leaves out: ``docs/notes/tokenizers.md``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqpack.data.tokenizer import EMBEDDED, TokenizerError, load_tokenizer, tokenizer_fingerprint

__all__ = ["TOKENIZER_ALIASES", "TokenizerComparison", "canonical_tokenizer_name", "compare_tokenizer"]

#: canonical tokenizer key -> names (lower case, without the ``qwen/`` organisation) that denote it.
TOKENIZER_ALIASES: dict[str, frozenset[str]] = {
    "qwen3": frozenset({
        "qwen3",
        "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b",
        "qwen3-30b-a3b", "qwen3-235b-a22b",
    }),
}

_HF_CACHE = re.compile(r"models--([^/\\]+)--([^/\\]+)(?:[/\\]snapshots[/\\][^/\\]+)?$")


@dataclass(frozen=True)
class TokenizerComparison:
    """Outcome of :func:`compare_tokenizer`.

    Attributes:
        same: True when the stored data was tokenized with the config's tokenizer; None when it could
            not be decided (the metadata records no tokenizer).
        method: ``"hash"`` (file + chat-template hashes equal), ``"content"`` (files differ, serialized
            tokenizer and chat template equal), ``"name"`` (normalised names / alias table) or
            ``"none"`` (nothing to compare).
        detail: one sentence saying what was compared and the result, for messages.
    """

    same: bool | None
    method: str
    detail: str


def canonical_tokenizer_name(name: str) -> str:
    """Normalised tokenizer name used when tokenizers are compared by name.

    Lower case; trailing path separators removed; ``.../models--Qwen--Qwen3-8B/snapshots/<rev>`` (the
    Hugging Face cache layout) becomes ``qwen/qwen3-8b``; any other path becomes its base name; the
    ``qwen/`` organisation is dropped; a name listed in :data:`TOKENIZER_ALIASES` becomes its key.

    Examples: ``"Qwen/Qwen3-8B"`` -> ``"qwen3"``, ``"qwen3"`` -> ``"qwen3"``,
    ``"meta-llama/Meta-Llama-3-8B-Instruct"`` -> ``"meta-llama/meta-llama-3-8b-instruct"``.
    """
    n = str(name).strip().rstrip("/\\")
    m = _HF_CACHE.search(n)
    if m:
        n = f"{m.group(1)}/{m.group(2)}"
    elif ("/" in n or "\\" in n) and (n.startswith((".", "/", "~")) or "\\" in n or Path(n).exists()):
        n = re.split(r"[/\\]", n)[-1]
    n = n.lower()
    bare = n[len("qwen/"):] if n.startswith("qwen/") else n
    for key, names in TOKENIZER_ALIASES.items():
        if bare in names:
            return key
    return n


def _loadable_offline(name: str) -> bool:
    return name in EMBEDDED or Path(name).is_dir()


def _load(name: str):
    if name in EMBEDDED:  # immutable package data: load once per process
        return _load_embedded(name)
    return load_tokenizer(name, require_chat_template=False)


@functools.lru_cache(maxsize=4)
def _load_embedded(name: str):
    return load_tokenizer(name, require_chat_template=False)


def _backend_sha256(tok: Any) -> str | None:
    """sha256 of the serialized fast tokenizer: what ``tokenizer_fingerprint`` stores as the files hash
    of a tokenizer that has no local folder (e.g. loaded by hub id from the HF cache)."""
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    return hashlib.sha256(backend.to_str().encode()).hexdigest()


def _same_backend(a: Any, b: Any) -> bool:
    """Serialized fast tokenizers equal (``truncation``/``padding`` are runtime settings, ignored)."""
    ja, jb = (getattr(t, "backend_tokenizer", None) or getattr(t, "_tokenizer", None) for t in (a, b))
    if ja is None or jb is None or not hasattr(ja, "to_str") or not hasattr(jb, "to_str"):
        return False
    sa, sb = ja.to_str(), jb.to_str()
    if sa == sb:
        return True
    da, db = json.loads(sa), json.loads(sb)
    for d in (da, db):
        d.pop("truncation", None)
        d.pop("padding", None)
    return da == db


def _template(tok: Any) -> Any:
    t = getattr(tok, "chat_template", None)
    return repr(sorted(t.items())) if isinstance(t, dict) else t


def _short(h: str | None) -> str:
    return "none" if h is None else h[:12]


def compare_tokenizer(config_name: str, stored_name: str | None, stored_files_hash: str | None,
                      stored_template_hash: str | None) -> TokenizerComparison:
    """Decide whether data recorded with (``stored_name``, hashes) was tokenized with ``config_name``.

    Args:
        config_name: the config's ``tokenizer`` (name, hub id or local path).
        stored_name, stored_files_hash, stored_template_hash: ``metadata.json``'s ``tokenizer``,
            ``tokenizer_hash`` and ``chat_template_hash``.

    Returns:
        :class:`TokenizerComparison` (module docstring for the method order). Never raises for an
        unloadable tokenizer: it falls back to names and says so in ``detail``.
    """
    if stored_name is None and stored_files_hash is None:
        return TokenizerComparison(None, "none", "the stored metadata records no tokenizer; not compared")
    why_names = f"{config_name!r} cannot be loaded offline (it is neither 'qwen3' nor an existing local folder)"
    if _loadable_offline(config_name):
        if stored_files_hash is None:
            why_names = "the stored metadata has no tokenizer hash"
        else:
            try:
                tok = _load(config_name)
            except TokenizerError as e:
                tok, why_names = None, f"{config_name!r} could not be loaded ({e})"
            if tok is not None:
                fp = tokenizer_fingerprint(tok)
                files_eq = fp["files_sha256"] == stored_files_hash
                tmpl_eq = fp["chat_template_sha256"] == stored_template_hash
                if files_eq and tmpl_eq:
                    return TokenizerComparison(True, "hash", f"tokenizer {config_name!r}: file and chat-template "
                                               f"hashes equal the stored ones (stored as {stored_name!r})")
                other = None
                if stored_name and stored_name != config_name and _loadable_offline(stored_name):
                    try:
                        other = _load(stored_name)
                    except TokenizerError:
                        other = None
                    if other is not None:
                        ofp = tokenizer_fingerprint(other)
                        if (ofp["files_sha256"], ofp["chat_template_sha256"]) != (stored_files_hash,
                                                                                   stored_template_hash):
                            other = None  # the stored folder changed since packing: its content proves nothing
                if tmpl_eq and _backend_sha256(tok) == stored_files_hash:
                    return TokenizerComparison(True, "content", (
                        f"tokenizer {config_name!r} vs stored {stored_name!r}: the stored hash is of the serialized "
                        "tokenizer (it was loaded without a local folder) and equals this one's; chat-template "
                        "hashes equal"))
                if other is not None and _template(tok) == _template(other) and _same_backend(tok, other):
                    return TokenizerComparison(True, "content", (
                        f"tokenizer {config_name!r} vs stored {stored_name!r}: files differ but the serialized "
                        "tokenizers (vocabulary, merges, normalizer, pre-tokenizer, added tokens) and chat "
                        "templates are identical"))
                parts = []
                if not files_eq:
                    parts.append(f"files sha256 stored {_short(stored_files_hash)} vs config "
                                 f"{_short(fp['files_sha256'])}")
                if not tmpl_eq:
                    parts.append(f"chat template sha256 stored {_short(stored_template_hash)} vs config "
                                 f"{_short(fp['chat_template_sha256'])}")
                return TokenizerComparison(False, "hash", (
                    f"tokenizer {config_name!r} (loaded offline) differs from the one the data was tokenized with "
                    f"(stored as {stored_name!r}): " + "; ".join(parts)))
    if stored_name is None:
        return TokenizerComparison(None, "none", f"the stored metadata records no tokenizer name and {why_names}; "
                                   "not compared")
    a, b = canonical_tokenizer_name(config_name), canonical_tokenizer_name(stored_name)
    if a == b:
        via = "" if config_name.strip().lower() == stored_name.strip().lower() else f" (both normalise to {a!r})"
        return TokenizerComparison(True, "name", (
            f"tokenizer compared by name only, since {why_names}: config {config_name!r} = stored "
            f"{stored_name!r}{via}"))
    return TokenizerComparison(False, "name", (
        f"tokenizer compared by name only, since {why_names}: config {config_name!r} (normalised {a!r}) "
        f"vs stored {stored_name!r} (normalised {b!r})"))
