"""``seqpack bench prepare``: tokenize + pack + write, seqpack against TRL's own preparation.

Both programs start from the same files and the same tokenizer (the embedded Qwen3 tokenizer,
``load_tokenizer("qwen3")``) and end with packed rows on disk; the whole path is timed (median wall
and CPU seconds of ``repeats`` runs):

seqpack
    :func:`seqpack.pipeline.pack_dataset`: read + normalise + chat template + assistant-only labels
    (``prepare``), plan (default algorithm), build and validate every THD row, write Parquet shards
    and ``metadata.json``.
TRL (1.16, public functions, not its Trainer)
    what ``SFTTrainer._prepare_dataset`` does for a conversational dataset: the records are read
    with ``json`` and turned into ChatML ``messages`` (alpaca -> user/assistant; sharegpt roles
    renamed; tools parsed), ``datasets.Dataset.from_list``, then ``Dataset.map`` of
    ``tokenizer.apply_chat_template(messages, tools=..., chat_template=<TRL qwen3_training.jinja>,
    return_dict=True, return_assistant_tokens_mask=True)`` (TRL's own Qwen3 *training* template with
    ``{% generation %}`` markers, so TRL gets assistant masks too: its ``get_training_chat_template``
    cannot patch the embedded template), labels = ``input_ids`` with non-assistant tokens at -100,
    ``select_columns(["input_ids", "labels"])``, ``trl.data_utils.pack_dataset(..., strategy="bfd")``
    and ``Dataset.to_parquet``.

Packing efficiency = tokens in packs / (packs * seq_length) for each side (each side counts its
own tokens: the two templates render a few tokens differently, both totals are in the JSON).
Goal (issue #7): seqpack >= 2x faster end to end (wall) at equal or better packing efficiency.
Before any timed run, each program runs once, untimed, on :data:`WARMUP_RECORDS` synthetic chats, so
one-time costs of the process (imports, chat-template compilation, numba kernel loading) are not
charged to whichever data set comes first (with 1 repeat, as in ``--quick``, they used to be).

Data sets: the text files of ``../shared/data`` that both sides can read (alpaca, sharegpt,
sharegpt with tools), each on its own, and a synthetic OpenAI-format chat set of ``records`` records
written by :func:`write_synthetic_chat`. A missing folder or file is printed as a note and listed in
``skipped`` (the command line refuses a ``--shared-data`` folder that does not exist or holds none of
the files: :func:`check_shared_data`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.bench.timing import bar_chart, ensure_out_dir, print_table, timed, verdict, write_json

__all__ = [
    "PrepareOptionError",
    "PrepareDataError",
    "THINK_NOTE",
    "write_synthetic_chat",
    "real_datasets",
    "check_shared_data",
    "trl_prepare_and_pack",
    "seqpack_prepare_and_pack",
    "run_prepare",
    "compare_sides",
    "SHARED_FILES",
]


class PrepareOptionError(ValueError):
    """A setting of the benchmark leaves nothing to run or pack (the command line exits 2)."""


class PrepareDataError(ValueError):
    """A data file could not be read or prepared by seqpack or by the TRL path (the command line exits 1);
    the message names the file, the side and the cause."""


#: Why the two sides count different tokens on multi-turn chats (checked record by record on the four
#: demo files of ../shared/data: apart from these blocks, both sides render every record to the same text).
THINK_NOTE = ("why tokens differ: TRL's qwen3_training.jinja writes an empty think block "
              "'<think>\\n\\n</think>\\n\\n' (4 tokens) into every assistant turn, the model's chat template "
              "(used by seqpack) only into the turns after the last user message; trainable tokens also differ "
              "because TRL's assistant mask covers those blocks and the '\\n' after each <|im_end|>")

#: Printed after the verdicts of a ``--quick`` run.
QUICK_NOTE = ("note: --quick verdicts are informational (fixed start-up costs dominate 2,000 records): the >= 2x "
              "goal is judged on the full run (`seqpack bench prepare`: 100,000 synthetic records; real files, "
              "3 repeats)")

#: Files of ../shared/data used (text-only records that both seqpack and the TRL path can read).
SHARED_FILES = (
    "llama-factory/alpaca_en_demo.json",
    "llama-factory/identity.json",
    "llama-factory/glaive_toolcall_en_demo.json",
    "fastchat/dummy_conversation.json",
)

_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which have not "
    "model data token sequence pack training batch length loss gradient attention layer memory "
    "python function return value list dict string number error file line index record sample "
    "please explain how why what when where could would should write short long answer question "
    "first second third next finally example result output input system user assistant tool call "
    "search weather city price order time date name email account update delete create report"
).split()


#: Synthetic chats each program prepares once, untimed, before the timed runs.
WARMUP_RECORDS = 50


def write_synthetic_chat(path: str | os.PathLike, records: int, *, seed: int = 0) -> Path:
    """Write ``records`` synthetic OpenAI-format chats (JSONL ``{"messages": [...]}``) to ``path``.

    Mix (deterministic for ``seed``): 30 % have a system prompt; 1-3 user/assistant exchanges
    (weights 60/25/15 %); user turns ~lognormal(median 40 words), assistant turns ~lognormal(median
    120 words), each capped at 1,500 words; words from a fixed 120-word list plus numbers. With the
    Qwen3 tokenizer that is a median of about 250 tokens per record with a long tail.

    Raises:
        ValueError: ``records < 1``.
    """
    if records < 1:
        raise ValueError(f"records must be >= 1, got {records}")
    rng = np.random.default_rng(seed)
    words = np.array(_WORDS)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def text(median: float) -> str:
        n = int(min(1500, max(1, rng.lognormal(np.log(median), 0.9))))
        w = words[rng.integers(0, len(words), n)].tolist()
        for j in rng.integers(0, n, max(1, n // 25)):
            w[int(j)] = str(int(rng.integers(0, 10_000)))
        return " ".join(w).capitalize() + "."

    with open(path, "w") as f:
        for i in range(records):
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": text(15)})
            for _ in range(int(rng.choice([1, 2, 3], p=[0.6, 0.25, 0.15]))):
                msgs.append({"role": "user", "content": text(40)})
                msgs.append({"role": "assistant", "content": text(120)})
            f.write(json.dumps({"id": f"synthetic-{i}", "messages": msgs}) + "\n")
    return path


def real_datasets(shared_data: str | os.PathLike) -> list[Path]:
    """The files of :data:`SHARED_FILES` that exist under ``shared_data`` (``../shared/data``)."""
    root = Path(shared_data)
    return [root / f for f in SHARED_FILES if (root / f).is_file()]


def check_shared_data(shared_data: str | os.PathLike, *, option: str = "--shared-data") -> list[Path]:
    """Check a real-data folder the user named explicitly; return the files of it that will run.

    Args:
        shared_data: the folder (``../shared/data`` layout: ``llama-factory/...``, ``fastchat/...``).
        option: how the caller names the setting in messages.

    Returns:
        :func:`real_datasets` of the folder (at least one file).

    Raises:
        ValueError: the folder does not exist, is a file, or holds none of :data:`SHARED_FILES`
            (the message names ``option``, the path and the files looked for).
    """
    root = Path(shared_data)
    if not root.exists():
        raise ValueError(f"{option} {root}: folder not found; pass the folder that holds llama-factory/ and "
                         "fastchat/ (by default ../shared/data beside the source checkout), or leave the option out")
    if not root.is_dir():
        raise ValueError(f"{option} {root}: this is a file, not a folder; pass the folder that holds "
                         "llama-factory/ and fastchat/")
    found = real_datasets(root)
    if not found:
        raise ValueError(f"{option} {root}: none of the files this benchmark reads is there (looked for "
                         f"{', '.join(SHARED_FILES)}); pass the folder that holds them, or leave the option out")
    return found


# ------------------------------------------------------------------------------------------ TRL path
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


def trl_prepare_and_pack(path: Path, tokenizer: Any, seq_length: int, out_file: Path) -> dict[str, Any]:
    """TRL's SFT preparation + ``pack_dataset(strategy="bfd")`` + ``to_parquet`` (module docstring).

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
        ds = ds.map(tokenize_fn, remove_columns=ds.column_names)
    except (TemplateError, KeyError, TypeError, ValueError) as exc:
        raise PrepareDataError(f"TRL path could not apply its chat template to a record of {path} "
                               f"({type(exc).__name__}: {exc})") from None
    ds = ds.select_columns(["input_ids", "labels"])
    packed = pack_dataset(ds, seq_length, strategy="bfd")
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


def seqpack_prepare_and_pack(path: Path, tokenizer: Any, seq_length: int, out_dir: Path) -> dict[str, Any]:
    """``seqpack.pipeline.pack_dataset`` (tokenize + plan + build/validate rows + write).

    Returns:
        ``{"packs", "tokens", "trainable_tokens", "samples", "efficiency", "timings_s", "report",
        "report_examples"}``: ``report`` = the :class:`~seqpack.data.sample.PrepareReport` counts
        ``{status: {reason: count}}`` (records dropped, skipped, truncated...), ``report_examples`` =
        up to 3 dropped/skipped records (``sample_id``, ``reason``, ``detail``).

    Raises:
        PrepareOptionError: nothing left to pack at ``seq_length`` (the message says to raise
            ``--seq-length``).
        PrepareDataError: the file cannot be read or holds a malformed record (seqpack's message names
            the file and record), or holds no record.
    """
    from seqpack.data.tokenizer import TokenizerError
    from seqpack.pipeline import NothingToPackError, pack_dataset

    try:
        res = pack_dataset([path], out_dir, tokenizer=tokenizer, seq_length=seq_length, overwrite=True)
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
def _count_run(ids: np.ndarray, pattern: Sequence[int]) -> int:
    """Occurrences of the token run ``pattern`` in the 1-D id array ``ids``."""
    k = len(pattern)
    if k == 0 or ids.shape[0] < k:
        return 0
    hit = np.ones(ids.shape[0] - k + 1, dtype=bool)
    for j, t in enumerate(pattern):
        hit &= ids[j:ids.shape[0] - k + 1 + j] == t
    return int(hit.sum())


def _flat(files: Sequence[Path], column: str) -> np.ndarray:
    """One list column of Parquet files, flattened to a 1-D numpy array."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parts = [pc.list_flatten(pq.read_table(f, columns=[column]).column(column)).to_numpy(zero_copy_only=False)
             for f in files]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _fmt_reasons(reasons: dict[str, int]) -> str:
    return ", ".join(f"{r}: {c:,}" for r, c in reasons.items())


def compare_sides(entry: dict[str, Any], *, seq_length: int, seqpack_dir: Path, trl_file: Path,
                  think_ids: Sequence[int]) -> dict[str, Any]:
    """Say why seqpack and TRL prepared different samples or tokens from the same file.

    Read from what each side wrote (outside the timed runs): seqpack's report (records dropped or
    skipped, with reasons and examples), TRL's packed rows (samples exactly ``seq_length`` tokens long,
    i.e. cut by ``pack_dataset``'s truncation or that long already, and samples with no trainable
    token), and on both sides the number of empty think blocks ``think_ids`` (the rendered
    ``<think>\\n\\n</think>\\n\\n``), which TRL's training template writes into every assistant turn.

    Args:
        entry: a data-set entry of :func:`run_prepare` with ``seqpack`` and ``trl`` blocks.
        seqpack_dir: seqpack's output folder (``data/*.parquet`` shards).
        trl_file: TRL's ``to_parquet`` file (``input_ids``, ``labels``, ``seq_lengths`` per pack).
        think_ids: token ids of an empty think block.

    Returns:
        ``{"samples": {"seqpack", "trl"}, "tokens": {"seqpack", "trl"}, "seqpack_report",
        "seqpack_report_examples", "trl_samples_at_seq_length", "trl_samples_without_trainable_tokens",
        "think_blocks": {"seqpack", "trl"}, "think_block_tokens", "notes"}``; ``notes`` holds one line per
        difference (empty when both sides agree on samples and tokens).
    """
    sp, tr = entry["seqpack"], entry["trl"]
    short = table_name(entry["dataset"])
    seq_lens = _flat([trl_file], "seq_lengths").astype(np.int64)
    trained = (_flat([trl_file], "labels") != -100).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]) if seq_lens.size else np.zeros(0, np.int64)
    per_sample = np.add.reduceat(trained, starts) if seq_lens.size else np.zeros(0, np.int64)
    at_cap = int((seq_lens == seq_length).sum())
    no_train = int((per_sample == 0).sum())
    think = {"seqpack": _count_run(_flat(sorted((seqpack_dir / "data").glob("*.parquet")), "input_ids"), think_ids),
             "trl": _count_run(_flat([trl_file], "input_ids"), think_ids)}
    think_tokens = len(think_ids) * (think["trl"] - think["seqpack"])
    report = sp.get("report", {})
    notes = []
    if sp["samples"] != tr["samples"]:
        lost = {st: r for st, r in report.items() if st in ("dropped", "skipped")}
        why = "; ".join(f"{st} {sum(r.values()):,} ({_fmt_reasons(r)})" for st, r in lost.items())
        line = (f"note: {short}: samples differ: seqpack {sp['samples']:,}, TRL {tr['samples']:,}; seqpack's report: "
                + (why or "nothing dropped or skipped"))
        if sp.get("report_examples"):
            ex = sp["report_examples"][0]
            line += f" (e.g. {ex['sample_id']}: {ex['detail']})"
        line += (f"; TRL's pack_dataset keeps rows over {seq_length:,} tokens, cut to their first {seq_length:,} "
                 f"(TRL samples exactly {seq_length:,} tokens long: {at_cap:,}; with no trainable token: {no_train:,})")
        notes.append(line)
    diff = tr["tokens"] - sp["tokens"]
    if diff:
        line = (f"note: {short}: tokens differ: seqpack {sp['tokens']:,}, TRL {tr['tokens']:,} ({diff:+,}); "
                f"empty think blocks: seqpack {think['seqpack']:,}, TRL {think['trl']:,} = {think_tokens:+,} tokens")
        rest = diff - think_tokens
        if rest and tr["samples"] > sp["samples"]:
            line += f"; the other {rest:+,} are in the samples TRL keeps and seqpack drops"
        elif rest:
            line += f"; {rest:+,} not explained by think blocks"
        notes.append(line)
    return {"samples": {"seqpack": sp["samples"], "trl": tr["samples"]},
            "tokens": {"seqpack": sp["tokens"], "trl": tr["tokens"]},
            "seqpack_report": report, "seqpack_report_examples": sp.get("report_examples", []),
            "trl_samples_at_seq_length": at_cap, "trl_samples_without_trainable_tokens": no_train,
            "think_blocks": think, "think_block_tokens": think_tokens, "notes": notes}


# ------------------------------------------------------------------------------------------ driver
def table_name(dataset: str) -> str:
    """Data-set name for tables and charts: the file name (``llama-factory/alpaca_en_demo.json`` ->
    ``alpaca_en_demo.json``; the files of :data:`SHARED_FILES` have distinct names); other names as is."""
    return dataset.rsplit("/", 1)[-1] if dataset.endswith((".json", ".jsonl")) else dataset


def run_prepare(
    *,
    shared_data: str | os.PathLike | None = None,
    records: int = 100_000,
    seq_length: int = 4096,
    repeats: int = 3,
    synthetic_repeats: int | None = None,
    out_dir: str | os.PathLike = "bench_results",
    tokenizer: Any = "qwen3",
    trl: bool = True,
    quick: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the comparison and write ``prepare.json`` + ``prepare_time.png``.

    After the table, one ``note:`` line per data set whose samples or tokens differ between the two
    sides (:func:`compare_sides`: seqpack's drop reasons and counts, TRL's cut rows, empty think
    blocks), then :data:`THINK_NOTE` when think blocks account for a difference.

    Args:
        shared_data: folder of the real data (``../shared/data``); ``None`` = synthetic only; a missing
            folder or file is logged as a note and listed in ``skipped``.
        records: records of the synthetic chat set (0 = none).
        seq_length: pack capacity in tokens.
        repeats: timed runs per program on the real files (median reported).
        synthetic_repeats: timed runs on the synthetic set (default: ``repeats``, but 1 from 20,000
            records on: the full default run then takes about 10 minutes on 2 cores, estimated from a full
            run whose timed runs summed to 8.6 minutes; the JSON records it).
        out_dir: folder for the JSON/PNG (and a scratch folder ``_prepare_work`` removed at the end).
        tokenizer: name/path for ``load_tokenizer`` or a loaded tokenizer (used by both sides).
        trl: include TRL (skipped with a recorded reason when not importable).
        quick: a ``--quick`` run: each verdict is printed and stored as "quick: informational", then
            :data:`QUICK_NOTE` (the goal is judged on the full run).
        log: one-line progress messages.

    Returns:
        the JSON payload: ``benchmark``, ``seq_length``, ``records``, ``datasets`` (one entry per data
        set with ``seqpack`` and ``trl`` blocks: packs, tokens, trainable_tokens, samples, efficiency,
        wall_s, cpu_s; plus ``speedup_wall``, ``speedup_cpu`` = TRL / seqpack, and ``comparison`` from
        :func:`compare_sides`), ``goals``, ``skipped``, ``notes`` (the printed note lines), ``quick``.

    Raises:
        PrepareOptionError: nothing to run (no real data and ``records == 0``), ``repeats < 1``, or a
            data set that seqpack packs to nothing at ``seq_length`` (message says to raise ``--seq-length``).
        PrepareDataError: a data file cannot be read or holds a malformed record (message names the file,
            the side and the cause).
        OutputDirError: ``out_dir`` cannot be created or written (checked before any work).
    """
    from seqpack.bench.references import trl_available
    from seqpack.data.tokenizer import load_tokenizer

    if repeats < 1:
        raise PrepareOptionError(f"repeats must be >= 1, got {repeats}")
    out_dir = ensure_out_dir(out_dir, option="out_dir")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    work = Path(tempfile.mkdtemp(prefix="_prepare_work", dir=out_dir))
    skipped: list[dict[str, Any]] = []
    try:
        files: list[tuple[str, Path, int]] = []
        if shared_data is not None and Path(shared_data).is_dir():
            files += [(f"{p.parent.name}/{p.name}", p, repeats) for p in real_datasets(shared_data)]
            for f in SHARED_FILES:
                if not (Path(shared_data) / f).is_file():
                    skipped.append({"dataset": f, "reason": f"file not found under {shared_data}"})
                    log(f"note: {Path(shared_data) / f} not found: skipped")
        elif shared_data is not None:
            skipped.append({"dataset": "shared data", "reason": f"folder not found: {shared_data}"})
            log(f"note: real-data folder {shared_data} not found: its data sets are skipped (synthetic data only)")
        if records > 0:
            syn = write_synthetic_chat(work / f"synthetic_chat_{records}.jsonl", records)
            syn_reps = synthetic_repeats or (1 if records >= 20_000 else repeats)
            files.append((f"synthetic_chat ({records:,} records)", syn, syn_reps))
        if not files:
            raise PrepareOptionError("nothing to benchmark: no shared data found and records == 0")
        has_trl = trl and trl_available()
        if trl and not has_trl:
            skipped.append({"dataset": "*", "reason": "trl/datasets not importable: TRL side skipped"})
        warm = write_synthetic_chat(work / "warmup_chat.jsonl", WARMUP_RECORDS, seed=1)
        log(f"warm-up (untimed): {WARMUP_RECORDS} synthetic chats, each program once")
        try:
            seqpack_prepare_and_pack(warm, tok, seq_length, work / "seqpack_out")
            if has_trl:
                trl_prepare_and_pack(warm, tok, seq_length, work / "trl_out.parquet")
        except Exception as e:  # noqa: BLE001 - e.g. a seq_length too small for the warm-up chats
            log(f"note: warm-up skipped ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "the first timed run carries the one-time costs")
        entries: list[dict[str, Any]] = []
        goals: list[dict[str, Any]] = []
        think_ids = list(tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]) if has_trl else []
        for name, path, reps in files:
            log(f"{name}: seqpack x{reps}")
            sp, t_sp = timed(lambda: seqpack_prepare_and_pack(path, tok, seq_length, work / "seqpack_out"), reps)
            entry: dict[str, Any] = {"dataset": name, "path": str(path), "repeats": reps,
                                     "seqpack": {**sp, "wall_s": t_sp.wall_s, "cpu_s": t_sp.cpu_s}}
            if has_trl:
                log(f"{name}: TRL x{reps}")
                tr, t_tr = timed(lambda: trl_prepare_and_pack(path, tok, seq_length, work / "trl_out.parquet"), reps)
                entry["trl"] = {**tr, "wall_s": t_tr.wall_s, "cpu_s": t_tr.cpu_s}
                entry["speedup_wall"] = round(t_tr.wall_s / t_sp.wall_s, 2)
                entry["speedup_cpu"] = round(t_tr.cpu_s / t_sp.cpu_s, 2)
                ok = entry["speedup_wall"] >= 2.0 and sp["efficiency"] >= tr["efficiency"]
                goals.append(verdict(
                    f"{name}: seqpack >= 2x faster end to end at >= packing efficiency", ok,
                    f"{entry['speedup_wall']:.2f}x wall ({entry['speedup_cpu']:.2f}x CPU); efficiency "
                    f"{sp['efficiency']:.4f} vs TRL {tr['efficiency']:.4f}; packs {sp['packs']} vs {tr['packs']}",
                    informational="quick: informational" if quick else None))
                entry["comparison"] = compare_sides(entry, seq_length=seq_length, seqpack_dir=work / "seqpack_out",
                                                    trl_file=work / "trl_out.parquet", think_ids=think_ids)
            entries.append(entry)
        rows = []
        for e in entries:  # one row per data set and program: the table fits a terminal, names stay whole
            short = table_name(e["dataset"])
            for prog, key in (("seqpack", "seqpack"), ("TRL", "trl")):
                r = e.get(key)
                if r is None:
                    continue
                rows.append([short, prog, r["samples"], r["tokens"], r["packs"], r["efficiency"], r["wall_s"], r["cpu_s"],
                             e.get("speedup_wall") if key == "seqpack" else None,
                             e.get("speedup_cpu") if key == "seqpack" else None])
        print_table(f"prepare: tokenize + pack + write, seq_length={seq_length} (median of repeats; "
                    "speed-up = TRL time / seqpack time)",
                    ["dataset", "program", "samples", "tokens", "packs", "efficiency", "wall s", "CPU s",
                     "speed-up wall", "speed-up CPU"], rows, text_columns=2)
        notes = [n for e in entries for n in e.get("comparison", {}).get("notes", [])]
        if any(e.get("comparison", {}).get("think_block_tokens") for e in entries):
            notes.append("note: " + THINK_NOTE)
        if quick and goals:
            notes.append(QUICK_NOTE)
        for line in notes:
            print(line)
        payload = {"benchmark": "prepare", "seq_length": seq_length, "records": records, "repeats": repeats,
                   "warmup": f"{WARMUP_RECORDS} synthetic chats, each program once, untimed",
                   "quick": quick, "tokenizer": str(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else
                   getattr(tok, "name_or_path", None), "datasets": entries, "goals": goals, "skipped": skipped,
                   "notes": notes}
        write_json(out_dir / "prepare.json", payload)
        labels, vals = [], []
        for e in entries:
            labels.append(f"{table_name(e['dataset'])}: seqpack")
            vals.append(e["seqpack"]["wall_s"])
            if "trl" in e:
                labels.append(f"{table_name(e['dataset'])}: TRL")
                vals.append(e["trl"]["wall_s"])
        bar_chart(out_dir / "prepare_time.png", labels, vals, title="tokenize + pack + write (wall s, median)",
                  ylabel="seconds", log=True, annotate=[f"{v:.3g}" for v in vals])
        return payload
    finally:
        shutil.rmtree(work, ignore_errors=True)
