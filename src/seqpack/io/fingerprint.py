"""Content hashes for packed-dataset fingerprints (inputs, tokenizer files, chat template, settings).

A fingerprint is the sha256 of a canonical JSON document (sorted keys, no whitespace) holding the
content hash of every input file plus every setting that changes the packed output. Two runs with the
same fingerprint produce the same packs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["sha256_file", "describe_input", "hash_tokenizer", "hash_text", "compute_fingerprint"]

_CHUNK = 1 << 20

# Files that define a Hugging Face tokenizer's behaviour.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_text(text: str | None) -> str | None:
    """Hex sha256 of a UTF-8 string, or ``None`` for ``None``."""
    if text is None:
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def describe_input(inp: Any) -> dict[str, Any]:
    """Identify one input for the fingerprint.

    Files: ``{path, bytes, sha256}``; directories: every file below it (sorted) hashed together;
    anything else (e.g. an in-memory dataset or a hub name) ``{path: repr, sha256: None}`` (such inputs
    make the fingerprint depend on their name only).
    """
    if isinstance(inp, (str, os.PathLike)):
        p = Path(inp)
        if p.is_file():
            return {"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
        if p.is_dir():
            h = hashlib.sha256()
            total = 0
            for f in sorted(q for q in p.rglob("*") if q.is_file()):
                rel = f.relative_to(p).as_posix()
                h.update(rel.encode() + b"\0" + sha256_file(f).encode() + b"\n")
                total += f.stat().st_size
            return {"path": str(p), "bytes": total, "sha256": h.hexdigest()}
        return {"path": str(inp), "bytes": None, "sha256": None}
    fp = getattr(inp, "_fingerprint", None)  # HF datasets.Dataset
    return {"path": f"<{type(inp).__name__}>", "bytes": None, "sha256": fp}


def hash_tokenizer(tokenizer: Any) -> tuple[str | None, str | None]:
    """Return ``(tokenizer_files_sha256, chat_template_sha256)`` for a HF tokenizer.

    The files hash covers the tokenizer files found in ``tokenizer.name_or_path`` (when it is a local
    directory); otherwise it falls back to hashing the vocabulary and special tokens. The chat-template
    hash is the sha256 of ``tokenizer.chat_template`` (``None`` if the tokenizer has none).
    """
    chat = getattr(tokenizer, "chat_template", None)
    if isinstance(chat, dict):
        chat = json.dumps(chat, sort_keys=True)
    chat_hash = hash_text(chat) if chat else None
    name = getattr(tokenizer, "name_or_path", None)
    files_hash = None
    if name and Path(str(name)).is_dir():
        d = Path(str(name))
        h = hashlib.sha256()
        found = False
        for fname in _TOKENIZER_FILES:
            f = d / fname
            if f.is_file():
                found = True
                h.update(fname.encode() + b"\0" + sha256_file(f).encode() + b"\n")
        if found:
            files_hash = h.hexdigest()
    if files_hash is None and hasattr(tokenizer, "get_vocab"):
        vocab = tokenizer.get_vocab()
        special = getattr(tokenizer, "all_special_tokens", [])
        files_hash = hash_text(json.dumps([sorted(vocab.items()), list(special)]))
    return files_hash, chat_hash


def compute_fingerprint(inputs: Iterable[Mapping[str, Any]], settings: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``{"inputs": [...], "settings": {...}}``.

    Args:
        inputs: the :func:`describe_input` dicts, in input order (order matters: it sets sample ids).
            Only each file's base name, size and content hash enter the fingerprint, not its directory.
        settings: every option that changes the packed output (capacity, multiples, algorithm, seed,
            policies, tokenizer and chat-template hashes, format version).
    """
    # Content, not location: the same files moved elsewhere give the same fingerprint.
    ins = [
        {"name": Path(str(i.get("path", ""))).name, "bytes": i.get("bytes"), "sha256": i.get("sha256")}
        if i.get("sha256") else {"name": str(i.get("path")), "sha256": None}
        for i in inputs
    ]
    doc = {"inputs": ins, "settings": dict(settings)}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
