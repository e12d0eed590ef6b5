"""Read a LLaMA-Factory ``dataset_info.json``: each dataset entry becomes a :class:`LlamaFactorySource`
whose records are rewritten into seqpack's alpaca / sharegpt keys, then read like any other record.

An entry's attributes are LLaMA-Factory's (``llamafactory.data.parser.DatasetAttr.join``, 0.9.5):
``file_name``, ``formatting`` (default ``alpaca``), ``columns`` and ``tags``. When ``columns`` (or
``tags``) is given, every column (tag) it leaves out is unset, not defaulted, as in LLaMA-Factory.
File paths and image paths are relative to the folder holding ``dataset_info.json`` (LLaMA-Factory's
``dataset_dir`` and default ``media_dir``). A directory ``file_name`` is every file in it (sorted).

Record rules follow LLaMA-Factory's converters (``llamafactory.data.converter``): alpaca's user turn is
``prompt + "\\n" + query`` (the non-empty ones) after the ``history`` pairs; sharegpt's first turn may be
the system tag, then turns alternate user/observation and assistant/function and end on an assistant
turn. A record LLaMA-Factory would skip as abnormal is a bad record here (``on_error`` decides).

Entries seqpack cannot read the same way are refused when the file is expanded, naming the entry and
the key: hub / script / cloud sources, ``ranking``, ``num_samples`` (LLaMA-Factory samples those at
random), preference or KTO columns, videos, audios, ``openai`` formatting (pass the file itself: seqpack
reads OpenAI ``messages`` records natively), alpaca with ``tools`` and unknown keys (LLaMA-Factory
ignores a misspelt key; here it would silently change the reading).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from seqpack.data.records import DataFormatError, RawRecord, json_kind

__all__ = ["DATASET_INFO_FILE", "LlamaFactorySource", "is_dataset_info", "read_dataset_info"]

#: The file name LLaMA-Factory reads from its ``dataset_dir`` (``llamafactory.extras.constants.DATA_CONFIG``).
DATASET_INFO_FILE = "dataset_info.json"

_COLUMNS = ("prompt", "query", "response", "history", "messages", "system", "tools", "images", "videos", "audios",
            "chosen", "rejected", "kto_tag")
_TAGS = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")
_COLUMN_DEFAULTS = {"prompt": "instruction", "query": "input", "response": "output", "messages": "conversations"}
_TAG_DEFAULTS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
_SOURCES = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name", "file_name")
_KEYS = (*_SOURCES, "formatting", "ranking", "subset", "split", "folder", "num_samples", "columns", "tags")
_FILE_TYPES = (".json", ".jsonl", ".parquet", ".arrow")


def is_dataset_info(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a LLaMA-Factory dataset config (file name ``dataset_info.json``)."""
    return Path(path).name == DATASET_INFO_FILE and Path(path).is_file()


@dataclass(frozen=True)
class LlamaFactorySource:
    """One data file of one ``dataset_info.json`` entry, read through the entry's mapping.

    Attributes:
        name: ``"<entry>"``, or ``"<entry>/<file>"`` for each file of a directory entry (sample ids are
            ``"<name>:<index>"``).
        entry: the dataset entry's name in ``dataset_info.json``.
        info_path: the ``dataset_info.json`` path.
        path: the data file.
        attrs: the entry's attributes with LLaMA-Factory's ``DatasetAttr`` field names and values.
    """

    name: str
    entry: str
    info_path: str
    path: Path
    attrs: dict[str, Any] = field(hash=False)

    @property
    def _fingerprint(self) -> str:
        """sha256 of the data file's bytes and the entry's attributes (read by ``seqpack.io.describe_input``)."""
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(json.dumps(self.attrs, sort_keys=True).encode())
        return h.hexdigest()

    def records(self, read: Callable[[Path], Iterator[RawRecord]]) -> Iterator[RawRecord]:
        """The file's records (read by ``read``, seqpack's file reader) in seqpack's keys; a record the
        mapping cannot convert carries its ``DataFormatError`` (skippable like malformed JSON)."""
        base = Path(self.info_path).resolve().parent
        convert = _alpaca if self.attrs["formatting"] == "alpaca" else _sharegpt
        for raw in read(self.path):
            if raw.error is None:
                try:
                    raw = RawRecord(convert(raw.data, self.attrs), raw.source, raw.index, raw.line, base)
                except _Bad as e:
                    err = DataFormatError(f"{e} (dataset {self.entry!r} of {self.info_path})", source=raw.source,
                                          index=raw.index, line=raw.line, reason=e.reason, fix=e.fix)
                    raw = RawRecord(None, raw.source, raw.index, raw.line, base, error=err)
            yield raw


def read_dataset_info(path: str | os.PathLike, dataset: str | list[str] | None = None) -> list[LlamaFactorySource]:
    """The sources of a LLaMA-Factory ``dataset_info.json`` (every entry, or the named ones).

    Args:
        path: the ``dataset_info.json`` file.
        dataset: entry names (a list, or one string of comma-separated names as LLaMA-Factory's
            ``dataset:`` setting); ``None`` = every entry, in file order.

    Returns:
        one :class:`LlamaFactorySource` per data file, in entry order.

    Raises:
        DataFormatError: the file is not a JSON object of entries; an entry is unknown, has an unknown
            or ill-typed key, a source seqpack does not read, or a missing / unsupported data file (the
            message names the entry and the key). With ``dataset=None`` and more than one entry, one error
            lists the entries that cannot be read, the usable ones and the ``--dataset`` that picks them.
    """
    src = os.fspath(path)
    try:
        info = json.loads(Path(src).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataFormatError(f"cannot read the LLaMA-Factory dataset config: {e}.", source=src, reason="bad_input",
                              fix="give a readable dataset_info.json (a JSON object of dataset entries).") from None
    if not isinstance(info, dict) or {"features", "builder_name", "splits"} & set(info):
        raise DataFormatError(
            "is not a LLaMA-Factory dataset config (a JSON object {name: {file_name, formatting, columns, ...}}).",
            source=src, reason="bad_input",
            fix="a Hugging Face datasets save_to_disk folder also holds a dataset_info.json: pass the folder itself.",
        )
    names = list(info) if dataset is None else (
        [n.strip() for n in dataset.split(",") if n.strip()] if isinstance(dataset, str) else list(dataset))
    unknown = [n for n in names if n not in info]
    if unknown:
        raise DataFormatError(f"no dataset entry {unknown} (entries: {list(info)[:20]}).", source=src,
                              reason="bad_input", fix="pick entries defined in this dataset_info.json.")
    out: list[LlamaFactorySource] = []
    refused: list[tuple[str, DataFormatError]] = []
    for n in names:
        try:
            out.extend(_entry_sources(n, entry_attributes(n, info[n], src), src))
        except DataFormatError as e:
            if dataset is not None or len(names) == 1:  # an entry the user named: its own error
                raise
            refused.append((n, e))
    if refused:
        raise _unusable_entries(src, names, refused)
    return out


def _unusable_entries(src: str, names: list[str], refused: list[tuple[str, DataFormatError]]) -> DataFormatError:
    """The error for a ``dataset_info.json`` read whole (no entry named) where some entries cannot be read
    (hub-only, a data file absent, ...): the entries that can (their files are present) and how to pick them."""
    bad = {n for n, _ in refused}
    usable = [n for n in names if n not in bad]
    shown = "; ".join(f"{n!r}: {e.detail.removeprefix(f'dataset {n!r}, ').rstrip('.')}" for n, e in refused[:3])
    keys = Counter(m.group(1) if (m := re.match(r"dataset .*?, key '([^']*)'", e.detail)) else "?" for _, e in refused)
    more = f"; and {len(refused) - 3} more; by key: {dict(keys.most_common())}" if len(refused) > 3 else ""
    if usable:
        pick = ",".join(usable[:5])
        fix = (f"pick the entries to pack with --dataset NAME[,NAME], e.g. `--dataset {pick}` (Python: "
               f"read_dataset_info(path, {pick!r}) as the input), or make the other entries readable.")
        have = f" Usable entries (their data file is present): {usable[:20]}" + (
            f" and {len(usable) - 20} more." if len(usable) > 20 else ".")
    else:
        fix, have = f"make an entry readable: {refused[0][1].fix}", " No entry is usable."
    return DataFormatError(
        f"{len(refused)} of {len(names)} dataset entries cannot be read ({shown}{more}), and without --dataset every "
        f"entry is packed.{have}", source=src, reason="bad_input", fix=fix)


def _refuse(src: str, entry: str, key: str, message: str, fix: str) -> DataFormatError:
    return DataFormatError(f"dataset {entry!r}, key {key!r}: {message}", source=src, reason="bad_input", fix=fix)


def entry_attributes(entry: str, obj: Any, src: str) -> dict[str, Any]:
    """The attributes LLaMA-Factory's ``get_dataset_list`` gives entry ``obj`` (``DatasetAttr`` fields and
    values), after checking every key; raises :class:`DataFormatError` naming the entry and the key."""
    if not isinstance(obj, dict):
        raise _refuse(src, entry, entry, f"the entry is {json_kind(obj)}, expected an object.",
                      "make every entry an object such as {\"file_name\": \"data.json\"}.")
    for key in obj:
        if key not in _KEYS:
            raise _refuse(src, entry, key, "unknown key (LLaMA-Factory would ignore it).",
                          f"use the keys {list(_KEYS)}; check the spelling.")
    for key in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"):
        if key in obj:
            raise _refuse(src, entry, key, "seqpack reads local files only.",
                          "download the data and give its path as file_name (relative to dataset_info.json).")
    if "file_name" not in obj:
        raise _refuse(src, entry, "file_name", "missing.", "give the data file (relative to dataset_info.json).")
    attrs: dict[str, Any] = {"load_from": "file", "dataset_name": obj["file_name"]}
    attrs.update(formatting=obj.get("formatting", "alpaca"), ranking=obj.get("ranking", False),
                 subset=obj.get("subset"), split=obj.get("split", "train"), folder=obj.get("folder"),
                 num_samples=obj.get("num_samples"))
    for group, names, defaults in (("columns", _COLUMNS, _COLUMN_DEFAULTS), ("tags", _TAGS, _TAG_DEFAULTS)):
        given = obj.get(group)
        if group in obj and not isinstance(given, dict):
            raise _refuse(src, entry, group, f"is {json_kind(given)}, expected an object.", f"make {group} an object.")
        for k in (given or {}):
            if k not in names:
                raise _refuse(src, entry, f"{group}.{k}", "unknown key (LLaMA-Factory would ignore it).",
                              f"use the {group} keys {list(names)}.")
        for k in names:
            v = given.get(k) if group in obj else defaults.get(k)
            if v is not None and not isinstance(v, str):
                raise _refuse(src, entry, f"{group}.{k}", f"is {json_kind(v)}, expected a string.",
                              "give the column / tag name as a string.")
            attrs[k] = v
    _check_supported(entry, attrs, src)
    return attrs


def _check_supported(entry: str, a: dict[str, Any], src: str) -> None:
    if not isinstance(a["dataset_name"], str) or not a["dataset_name"]:
        raise _refuse(src, entry, "file_name", "must be a non-empty string.", "give the data file's path.")
    if a["formatting"] == "openai":
        raise _refuse(src, entry, "formatting", "'openai' is not mapped here.",
                      "pass the data file itself: seqpack reads OpenAI {messages: [{role, content}]} records natively.")
    if a["formatting"] not in ("alpaca", "sharegpt"):
        raise _refuse(src, entry, "formatting", f"{a['formatting']!r} is not alpaca or sharegpt.",
                      "set formatting to alpaca or sharegpt.")
    if a["ranking"] is not False:
        raise _refuse(src, entry, "ranking", "preference (ranking) data is not packed for SFT.", "remove ranking.")
    if a["num_samples"] is not None:
        raise _refuse(src, entry, "num_samples", "LLaMA-Factory samples these records at random; seqpack reads all.",
                      "remove num_samples, or write the subset you want to a file.")
    for k in ("chosen", "rejected", "kto_tag", "videos", "audios"):
        if a[k] is not None:
            raise _refuse(src, entry, f"columns.{k}", "preference, KTO, video and audio columns are not packed here.",
                          f"remove columns.{k}.")
    if a["formatting"] == "alpaca" and a["tools"] is not None:
        raise _refuse(src, entry, "columns.tools", "alpaca records carry no tools in seqpack.",
                      "use sharegpt formatting for tool-use data.")
    need = ("prompt", "response") if a["formatting"] == "alpaca" else ("messages", "role_tag", "content_tag",
                                                                       "user_tag", "assistant_tag")
    for k in need:
        if a[k] is None:
            group = "tags" if k.endswith("_tag") else "columns"
            raise _refuse(src, entry, f"{group}.{k}", f"is unset, and {a['formatting']} records need it.",
                          f"give {group}.{k} (a {group} object unsets the keys it leaves out).")


def _entry_sources(entry: str, attrs: dict[str, Any], src: str) -> list[LlamaFactorySource]:
    local = Path(src).parent / attrs["dataset_name"]
    if local.is_dir():
        files = sorted(p for p in local.iterdir() if p.is_file())
    elif local.is_file():
        files = [local]
    else:
        raise _refuse(src, entry, "file_name", f"{os.fspath(local)} not found.",
                      "file_name is relative to the folder holding dataset_info.json.")
    if not files:
        raise _refuse(src, entry, "file_name", f"{os.fspath(local)} holds no file.", "point file_name at data files.")
    for f in files:
        if f.suffix.lower() not in _FILE_TYPES:
            raise _refuse(src, entry, "file_name", f"{os.fspath(f)}: seqpack reads {list(_FILE_TYPES)} files.",
                          "convert the file (e.g. CSV with `datasets`: load_dataset('csv', ...).to_json(...)).")
    many = len(files) > 1 or local.is_dir()
    return [LlamaFactorySource(f"{entry}/{f.name}" if many else entry, entry, src, f, attrs) for f in files]


class _Bad(Exception):
    def __init__(self, message: str, reason: str, fix: str) -> None:
        super().__init__(message)
        self.reason, self.fix = reason, fix


def _column(rec: Any, col: str, key: str, required: bool = False) -> Any:
    if not isinstance(rec, dict):
        raise _Bad(f"record is {json_kind(rec)}, expected an object.", "unknown_format", "store records as objects.")
    if required and col not in rec:
        raise _Bad(f"record has no column {col!r} (columns.{key}); its keys: {sorted(rec)[:12]}.", "missing_key",
                   f"give every record the column {col!r}, or map columns.{key} to the column holding it.")
    return rec.get(col)


def _media(rec: dict, a: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    if a["images"] is not None and rec.get(a["images"]) is not None:
        out["images"] = rec[a["images"]]
    if rec.get("id") is not None:
        out["id"] = rec["id"]
    return out


def _alpaca(rec: Any, a: dict[str, Any]) -> dict[str, Any]:
    prompt = _column(rec, a["prompt"], "prompt", True)
    query = _column(rec, a["query"], "query") if a["query"] else None
    out: dict[str, Any] = {"instruction": prompt if prompt else (query or ""), "input": query if prompt else "",
                           "output": _column(rec, a["response"], "response", True)}
    if a["history"] and isinstance(rec.get(a["history"]), list):
        out["history"] = rec[a["history"]]
    if a["system"] and rec.get(a["system"]):
        out["system"] = rec[a["system"]]
    return _media(rec, a, out)


def _sharegpt(rec: Any, a: dict[str, Any]) -> dict[str, Any]:
    turns = _column(rec, a["messages"], "messages", True)
    if not isinstance(turns, list):
        raise _Bad(f"column {a['messages']!r} is {json_kind(turns)}, expected a list of turns.",
                   "bad_content_type", "make it a list of turns.")
    role, content = a["role_tag"], a["content_tag"]
    if any(not isinstance(t, dict) for t in turns):
        raise _Bad("a turn is not an object.", "bad_content_type", f"each turn is {{{role}, {content}}}.")
    system = rec.get(a["system"]) if a["system"] else None
    if a["system_tag"] and turns and turns[0].get(role) == a["system_tag"]:
        system, turns = turns[0].get(content), turns[1:]
    names = {a["user_tag"]: "human", a["observation_tag"]: "observation", a["assistant_tag"]: "gpt",
             a["function_tag"]: "function_call"}
    names.pop(None, None)
    odd, even = {a["user_tag"], a["observation_tag"]} - {None}, {a["assistant_tag"], a["function_tag"]} - {None}
    conv = []
    for k, t in enumerate(turns):
        tag = t.get(role)
        if tag not in (odd, even)[k % 2]:
            raise _Bad(f"turn {k} has role tag {tag!r} where LLaMA-Factory expects one of {sorted((odd, even)[k % 2])} "
                       "(it skips this record as abnormal).", "unknown_role",
                       "fix the turn order (user/observation, then assistant/function, ...) or the tags mapping.")
        conv.append({"from": names[tag], "value": t.get(content)})
    if len(conv) % 2:
        raise _Bad(f"{len(conv)} turns: the conversation does not end on an assistant turn (LLaMA-Factory skips it).",
                   "no_assistant_turn", "end every conversation on an assistant / function turn.")
    out: dict[str, Any] = {"conversations": conv}
    if system:
        out["system"] = system
    if a["tools"] and rec.get(a["tools"]):
        out["tools"] = rec[a["tools"]]
    return _media(rec, a, out)
