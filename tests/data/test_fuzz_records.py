"""Fuzzed bad records (hypothesis, fixed seed): every record of a file is either packed or listed in the
report with its reason (``on_error="skip"``), and with the default ``on_error="raise"`` the only error is a
``DataFormatError`` naming the file and the record. No other exception, nothing lost."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from seqpack.data import prepare
from seqpack.data.records import DataFormatError

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
SURROGATE = "\ud800"

_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12), st.sampled_from(["", " ", "user", "assistant", "gpt", "human", "system", "tool",
                                           SURROGATE, "a" + SURROGATE, "{", '{"a": 1}', "[1]", "<image>"]))
_json = st.recursive(_scalar, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(
    st.sampled_from(["role", "content", "from", "value", "messages", "conversations", "tool_calls", "function",
                     "name", "arguments", "tools", "type", "instruction", "output", "input", "images", "id"]),
    c, max_size=3)), max_leaves=10)

_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "bogus", ""])},
    optional={"content": _json, "tool_calls": st.one_of(_json, st.lists(st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries(
            {"name": st.one_of(st.text(max_size=5), _scalar)}, optional={"arguments": _json})}), max_size=2))})

_record_obj = st.one_of(
    st.fixed_dictionaries({"messages": st.lists(_message, max_size=4)}, optional={"tools": _json, "id": _json}),
    st.fixed_dictionaries({"conversations": st.lists(st.fixed_dictionaries(
        {"from": st.sampled_from(["human", "gpt", "system", "function_call", "observation", "x"]),
         "value": _json}), max_size=4)}),
    st.fixed_dictionaries({"instruction": _json, "output": _json}, optional={"input": _json}),
    _json,
)

_line = st.one_of(
    _record_obj.map(lambda o: json.dumps(o)),
    st.just(json.dumps(GOOD)),
    st.sampled_from([
        "{not json", "[" * 5000 + "]" * 5000, '{"messages": ' + "[" * 100000 + "]" * 100000 + "}",
        '{"n": ' + "9" * 5000 + ', "messages": []}', "null", "42", '"text"', "[]", "{}",
        '{"messages": [{"role": "user", "content": "a\\ud800b"}, {"role": "assistant", "content": "x"}]}',
    ]),
)


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer):
    return qwen3_tokenizer


@seed(20261201)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(lines=st.lists(_line, min_size=1, max_size=6))
def test_fuzzed_records_are_packed_or_reported_never_lost(tmp_path_factory, tok, lines):
    path = tmp_path_factory.mktemp("fuzz") / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = [i for i, ln in enumerate(lines) if ln.strip()]

    samples, report = prepare(str(path), tok, seq_length=64, on_error="skip")
    assert report.records_read == len(records)
    packed = {s.index for s in samples}
    failed = {e.index for e in report.entries if e.status in ("skipped", "dropped")}
    assert packed.isdisjoint(failed)
    assert packed | failed == set(records), "a record was neither packed nor reported"
    for e in report.entries:
        assert e.reason and e.detail and e.source == str(path)

    try:
        prepare(str(path), tok, seq_length=64)
    except DataFormatError as e:
        msg = str(e)
        assert "data.jsonl" in msg and ("line " in msg or "record " in msg), msg
        assert "Fix:" in msg, msg
        bad_line = e.line if e.line is not None else (e.index + 1 if e.index is not None else None)
        assert bad_line is not None and bad_line - 1 in failed, msg
    else:
        assert not failed
