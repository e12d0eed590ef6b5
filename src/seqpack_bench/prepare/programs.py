"""The two programs compared by ``seqpack bench prepare``, each from data file to packed rows on disk:
TRL's conversational preparation + ``pack_dataset(bfd)`` and seqpack's ``pack_dataset``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqpack.data.tokenizer import TokenizerError
from seqpack_bench.prepare.data import PrepareDataError, PrepareOptionError

_SHAREGPT_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "function_call": "assistant", "observation": "tool", "tool": "tool"}


def _read_records(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    with open(path) as f:
        return json.load(f)


def _tool_call(value: Any) -> list[dict]:
    """A sharegpt ``function_call`` value (JSON ``{name, arguments}`` or a list) -> OpenAI ``tool_calls``.

    ``arguments`` are kept as a JSON string (both Qwen3 templates print a string as is and a dict with
    ``tojson``, which gives the same text): Arrow needs one type per column, and argument dicts differ
    per call."""
    obj = json.loads(value) if isinstance(value, str) else value
    out = []
    for c in obj if isinstance(obj, list) else [obj]:
        c = c.get("function", c)
        args = c.get("arguments", {})
        out.append({"type": "function", "function": {
            "name": c["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    return out


def _to_chatml(rec: dict) -> dict:
    """One record -> ``{"messages": [...], "tools": list | None}`` (the conversion a TRL user writes).

    alpaca -> system?/user/assistant; sharegpt roles renamed (``observation`` -> ``tool``), a
    ``function_call`` turn -> an assistant turn with ``tool_calls`` (attached to the assistant turn just
    before it when that one has none, as seqpack's reader does); bare glaive tool schemas wrapped as
    ``{"type": "function", "function": schema}``. Tool calls and tools then render the same way in
    TRL's training template and in the model's chat template (``<tool_call>`` blocks, wrapped schemas).
    """
    tools = rec.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools) if tools.strip() else None
    if isinstance(tools, dict):
        tools = [tools]
    tools = [t if (t.get("function") is not None or t.get("type") not in (None, "function"))
             else {"type": "function", "function": t} for t in tools or []] or None
    if "messages" in rec:
        return {"messages": rec["messages"], "tools": tools}
    if "conversations" in rec:
        msgs: list[dict] = []
        sys_prompt = rec.get("system") or rec.get("system_prompt")
        if sys_prompt:
            msgs.append({"role": "system", "content": sys_prompt})
        for m in rec["conversations"]:
            role = _SHAREGPT_ROLE.get(m["from"], m["from"])
            if m["from"] == "function_call":
                calls = _tool_call(m["value"])
                if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
                    msgs[-1]["tool_calls"] = calls
                else:
                    msgs.append({"role": "assistant", "content": "", "tool_calls": calls})
                continue
            msgs.append({"role": role, "content": m["value"]})
        return {"messages": msgs, "tools": tools}
    user = rec["instruction"] + ("\n" + rec["input"] if rec.get("input") else "")
    msgs = [{"role": "system", "content": rec["system"]}] if rec.get("system") else []
    return {"messages": msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output"]}],
            "tools": None}


def _trl_training_template() -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja").read_text()


def trl_prepare_and_pack(path: Path, tokenizer: Any, seq_length: int, out_file: Path,
                         num_proc: int | None = None) -> dict[str, Any]:
    """TRL's SFT preparation + ``pack_dataset(strategy="bfd")`` + ``to_parquet`` (module docstring).

    ``num_proc`` is TRL's ``dataset_num_proc``: ``SFTTrainer._prepare_dataset`` passes it as ``num_proc`` to
    every ``Dataset.map``, the tokenizing one and ``pack_dataset``'s (``map_kwargs``); ``None`` or 1 = one process.

    Returns:
        ``{"packs", "tokens", "trainable_tokens", "samples", "records", "efficiency"}``: ``samples`` =
        rows in TRL's packs (its ``seq_lengths``; ``pack_dataset`` drops empty rows and cuts rows over
        ``seq_length`` to their first ``seq_length`` tokens, keeping them), ``records`` = records read.

    Raises:
        PrepareDataError: the file cannot be read as JSON/JSONL or a record does not fit the conversion
            (the message names the file and record).
    """
    import datasets
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    datasets.disable_progress_bars()
    map_kwargs = {"num_proc": num_proc} if num_proc and num_proc > 1 else {}
    template = _trl_training_template()
    try:
        records = _read_records(path)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise PrepareDataError(f"TRL path could not read {path}: {exc}") from None
    rows = []
    for i, rec in enumerate(records):
        try:
            rows.append(_to_chatml(rec))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise PrepareDataError(f"TRL path could not convert record {i} of {path} to messages "
                                   f"({type(exc).__name__}: {exc})") from None
    # tools are stored as a JSON string column (Arrow needs one type per column), parsed back in map
    ds = Dataset.from_list([{"messages": r["messages"], "tools": json.dumps(r["tools"]) if r["tools"] else ""}
                            for r in rows])

    def tokenize_fn(example):
        tools = json.loads(example["tools"]) if example["tools"] else None
        out = tokenizer.apply_chat_template(example["messages"], tools=tools, chat_template=template, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        mask = out["assistant_masks"]
        return {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]}

    from jinja2 import TemplateError

    try:
        ds = ds.map(tokenize_fn, remove_columns=ds.column_names, **map_kwargs)
    except (TemplateError, KeyError, TypeError, ValueError) as exc:
        raise PrepareDataError(f"TRL path could not apply its chat template to a record of {path} "
                               f"({type(exc).__name__}: {exc})") from None
    ds = ds.select_columns(["input_ids", "labels"])
    packed = pack_dataset(ds, seq_length, strategy="bfd", map_kwargs=map_kwargs)
    packed.to_parquet(str(out_file))
    import pyarrow.compute as pc

    tbl = packed.data.table
    lens = pc.list_value_length(tbl.column("input_ids")).to_numpy(zero_copy_only=False)
    labels = pc.list_flatten(tbl.column("labels"))
    trainable = int(pc.sum(pc.not_equal(labels, -100)).as_py() or 0)
    tokens = int(lens.sum())
    samples = int(pc.sum(pc.list_value_length(tbl.column("seq_lengths"))).as_py() or 0)
    return {"packs": int(len(packed)), "tokens": tokens, "trainable_tokens": trainable, "samples": samples,
            "records": len(rows), "efficiency": round(tokens / (len(packed) * seq_length), 6)}


def seqpack_prepare_and_pack(path: Path, tokenizer: Any, seq_length: int, out_dir: Path,
                             num_proc: int | None = None) -> dict[str, Any]:
    """``seqpack.pipeline.pack_dataset`` (tokenize + plan + build/validate rows + write) with ``num_proc``
    preparation processes (``None``: pack_dataset's default, the cores available for inputs large enough).

    Returns:
        ``{"packs", "tokens", "trainable_tokens", "samples", "efficiency", "timings_s", "report",
        "report_examples"}``: ``report`` = the :class:`~seqpack.accounting.PrepareReport` counts
        ``{status: {reason: count}}`` (records dropped, skipped, truncated...), ``report_examples`` =
        up to 3 dropped/skipped records (``sample_id``, ``reason``, ``detail``).

    Raises:
        PrepareOptionError: nothing left to pack at ``seq_length`` (the message says to raise
            ``--seq-length``).
        PrepareDataError: the file cannot be read or holds a malformed record (seqpack's message names
            the file and record), or holds no record.
    """
    from seqpack.pipeline import NothingToPackError, pack_dataset

    try:
        res = pack_dataset([path], out_dir, tokenizer=tokenizer, seq_length=seq_length, overwrite=True,
                           num_proc=num_proc)
    except NothingToPackError as exc:  # its "Fix:" names `seqpack pack` options; say what fits here
        reason = str(exc).split(" Fix:")[0].rstrip(".")
        if reason.startswith("no record to pack"):  # an empty file: the data, not a setting
            raise PrepareDataError(f"{reason}; fix or remove {path}") from None
        raise PrepareOptionError(
            f"{reason}. Fix: raise --seq-length (now {seq_length}): the benchmark packs with `seqpack pack`'s "
            "defaults, so over-long records are truncated to --seq-length and only assistant tokens are "
            "trained; a record whose assistant tokens all lie past the cut has nothing left") from None
    except TokenizerError:
        raise  # the tokenizer, not the data: the caller's setting
    except (ValueError, OSError) as exc:  # DataFormatError (file + record + fix), unreadable file
        raise PrepareDataError(f"seqpack could not prepare {path}: {exc}") from None
    m = res.metadata
    examples = [{"sample_id": e.sample_id, "reason": e.reason, "detail": e.detail}
                for e in res.report.entries if e.status in ("dropped", "skipped")][:3]
    return {"packs": int(m.num_packs), "tokens": int(m.counts["tokens"]),
            "trainable_tokens": int(m.counts["trainable_tokens"]), "samples": int(m.counts["samples_packed"]),
            "efficiency": float(m.packing_efficiency), "timings_s": res.timings_s,
            "report": res.report.by_reason(), "report_examples": examples}


# ------------------------------------------------------------------------------------------ comparison
