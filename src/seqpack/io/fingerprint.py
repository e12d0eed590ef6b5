"""Content hashes for packed-dataset fingerprints (inputs and settings).

Tokenizers are identified by ``seqpack.data.tokenizer_fingerprint`` (files + chat template hashes);
those hashes enter the fingerprint as settings.

A fingerprint is the sha256 of a canonical JSON document (sorted keys, no whitespace) holding the
content hash of every input file plus every setting that changes the packed output. Two runs with the
same fingerprint produce the same packs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Mapping

from seqpack.io.metadata import DATA_DIR, REPORT_FILE, PackedDatasetError, _json_default

__all__ = ["FINGERPRINT_SETTINGS", "sha256_file", "describe_input", "compute_fingerprint", "fingerprint_settings",
           "recompute_fingerprint", "verify_fingerprint", "metadata_digest", "verify_metadata"]

#: The ``metadata.json`` keys that enter the fingerprint as settings (every one changes the packed output).
#: The packing job writes exactly these (``PackJob.metadata_settings``); verification reads them back.
FINGERPRINT_SETTINGS = (
    "format_version", "seq_length", "pad_to_multiple_of", "context_parallel_size", "effective_pad_multiple",
    "algorithm", "seed", "overlength", "train_on", "on_error", "format", "tokenizer_hash", "chat_template_hash",
    "pad_token_id",
)

_CHUNK = 1 << 20

def sha256_file(path: str | os.PathLike | BinaryIO) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks; ``path`` may also be a binary file object
    (read from its current position to the end, not closed)."""
    h = hashlib.sha256()
    if hasattr(path, "read"):
        for chunk in iter(lambda: path.read(_CHUNK), b""):
            h.update(chunk)
        return h.hexdigest()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


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


def fingerprint_settings(settings: Mapping[str, Any], *, fingerprint_extra: Mapping[str, Any] | None = None,
                         media: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings document of a fingerprint: the :data:`FINGERPRINT_SETTINGS` of ``settings``, the
    engine's ``fingerprint_extra`` (e.g. its planning mode) and, for image-text data, the image
    processor settings. The one rule both writing and verifying use.

    Raises:
        KeyError: ``settings`` lacks one of :data:`FINGERPRINT_SETTINGS`.
    """
    out = {k: settings[k] for k in FINGERPRINT_SETTINGS}
    if fingerprint_extra:
        out.update(fingerprint_extra)
    if media:
        out["image_processor"] = media.get("image_processor")
    return out


def recompute_fingerprint(metadata: Any) -> str:
    """The fingerprint a ``PackedMetadata`` should carry, from its own stored inputs and settings: a
    ``metadata.json`` whose settings were edited (``seq_length``, the pad multiple, the CP size, ...)
    no longer matches its ``fingerprint``."""
    d = metadata.to_dict()
    settings = fingerprint_settings(d, fingerprint_extra=(d.get("extra") or {}).get("fingerprint_extra"),
                                    media=d.get("media"))
    return compute_fingerprint(d.get("inputs") or [], settings)


def verify_fingerprint(p: Path, meta: Any) -> None:
    """Refuse a ``metadata.json`` (``meta``, a ``PackedMetadata`` read from the dataset folder ``p``) whose
    settings no longer match its fingerprint (they were edited after packing).

    Raises:
        PackedDatasetError: no fingerprint stored, or the recomputed one differs.
    """
    _check_recorded(p, "fingerprint", meta.fingerprint, lambda: recompute_fingerprint(meta),
                    f"{p}: metadata.json's settings do not match its fingerprint: seq_length, the pad multiple, "
                    "the CP size or another setting was edited after packing, so the rows may not be what the "
                    "metadata says")


#: Keys of ``metadata.json`` outside :func:`metadata_digest` (besides the engine's own informational
#: section ``extra["engine"]``, which is all a Ray-packed dataset's metadata has that the local engine's
#: has not): the digest itself and the derived ``capacity`` (= ``seq_length``).
_OUTSIDE_DIGEST = ("metadata_sha256", "capacity")


def metadata_digest(metadata: Any) -> str:
    """The sha256 of every key of a ``PackedMetadata`` (or its ``to_dict()``) except ``metadata_sha256``,
    ``capacity`` and ``extra["engine"]``, as canonical JSON (sorted keys, no whitespace).

    The writer stores it as ``metadata_sha256``; :func:`verify_metadata` recomputes it, so an edit to any
    key, informational ones included (``counts``, ``columns``, ``extra``, ``seqpack_version``, the packing
    statistics), is found. A key added by hand lands in ``extra`` when read and changes the digest too.
    """
    d = metadata if isinstance(metadata, Mapping) else metadata.to_dict()
    doc = {k: v for k, v in d.items() if k not in _OUTSIDE_DIGEST}
    extra = dict(doc.get("extra") or {})
    extra.pop("engine", None)
    doc["extra"] = extra
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def verify_metadata(p: Path, meta: Any) -> None:
    """Refuse a dataset folder ``p`` whose ``metadata.json`` (read as ``meta``) or ``report.jsonl`` was
    edited after packing: the settings against the fingerprint (:func:`verify_fingerprint`), every other
    key against ``metadata_sha256`` (:func:`metadata_digest`) and the report's bytes against
    ``report_sha256``; and a file in ``data/`` that is not a listed shard. The shards are checked by
    their own sha256 (``seqpack.io.cache.check_shard``).

    Raises:
        PackedDatasetError: naming what differs and the fix (re-pack; or ``verify=False`` to read a
            dataset written before seqpack recorded these hashes).
    """
    verify_fingerprint(p, meta)
    _check_recorded(p, "metadata_sha256", meta.metadata_sha256, lambda: metadata_digest(meta),
                    f"{p}: metadata.json was edited after packing (counts, columns, statistics, extra or another key)")
    report = p / REPORT_FILE

    def report_sha256() -> str:
        if not report.is_file() or report.is_symlink():
            raise PackedDatasetError(f"{p}: {REPORT_FILE} is missing (or a link); metadata.json records one. "
                                     "Re-pack the data")
        return sha256_file(report)

    _check_recorded(p, "report_sha256", meta.report_sha256, report_sha256,
                    f"{report} was edited after packing: the list of dropped/skipped/truncated records is not the "
                    "packer's")
    listed = meta.listed_files()
    data = p / DATA_DIR
    extra = sorted(f"{DATA_DIR}/{f.name}" for f in (data.iterdir() if data.is_dir() else ())
                   if f"{DATA_DIR}/{f.name}" not in listed)
    if extra:  # a tool that reads every data/*.parquet would serve them
        raise PackedDatasetError(
            f"{p}: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''} in {DATA_DIR}/ "
            + ("is not a shard metadata.json lists" if len(extra) == 1 else "are not shards metadata.json lists")
            + " (added after packing). Remove " + ("it" if len(extra) == 1 else "them") + ", or re-pack the data")


def _check_recorded(p: Path, key: str, stored: str | None, compute: Any, edited: str) -> None:
    """The one comparison of a hash ``metadata.json`` records (``key``, value ``stored``) with the one
    ``compute()`` gives now; ``edited`` is the message's start when they differ."""
    if not stored:
        raise PackedDatasetError(
            f"{p}: metadata.json has no {key}, so it cannot be verified: it was written by an older seqpack that "
            "did not record it; re-pack the data to verify it, or load it without verify")
    got = compute()
    if got != stored:
        raise PackedDatasetError(f"{edited} (metadata.json's {key} is {stored[:16]}..., the data now give "
                                 f"{got[:16]}...). Re-pack the data")
