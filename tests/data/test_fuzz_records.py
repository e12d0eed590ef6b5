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


# ------------------------------------------------------------------ image records: hostile references and files

_IMAGE_KINDS = ("good", "bomb", "truncated", "not_image", "dotdot", "absolute_out", "symlink_out", "missing")


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory):
    """data/images/{good,bomb,truncated,not_image}.png and a symlink out; outside.png beside data/."""
    import os

    from PIL import Image

    from tests.data.test_media_root import bomb_png

    top = tmp_path_factory.mktemp("fuzz_media")
    img = top / "data" / "images"
    img.mkdir(parents=True)
    Image.new("RGB", (56, 56), (9, 99, 199)).save(img / "good.png")
    Image.new("RGB", (56, 56), (1, 2, 3)).save(top / "outside.png")
    bomb_png(img / "bomb.png", 10_000, 10_000)
    (img / "truncated.png").write_bytes((img / "good.png").read_bytes()[:70])
    (img / "not_image.png").write_text("plain text")
    os.symlink(top / "outside.png", img / "symlink_out.png")
    return top


def _image_ref(kind: str, top) -> str:
    return {"dotdot": "../outside.png", "absolute_out": str(top / "outside.png"),
            "missing": "nope.png"}.get(kind, f"{kind}.png")


@seed(20261202)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(_IMAGE_KINDS), min_size=1, max_size=5))
def test_fuzzed_image_records_are_packed_or_reported_never_lost(tmp_path_factory, tok, image_tree, kinds):
    from seqpack.data.media import prepare_multimodal

    path = image_tree / "data" / f"data-{tmp_path_factory.mktemp('n').name}.jsonl"
    recs = [{"conversations": [{"from": "human", "value": "<image>What?"}, {"from": "gpt", "value": "A thing."}],
             "image": _image_ref(k, image_tree)} for k in kinds]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    small = {"max_pixels": 64 * 28 * 28, "min_pixels": 4 * 28 * 28}
    samples, report = prepare_multimodal(str(path), tok, seq_length=512, image_processor=small, on_error="skip")
    assert report.records_read == len(kinds)
    packed = {s.index for s in samples}
    reported = {e.index: e.reason for e in report.entries if e.status == "skipped"}
    assert packed.isdisjoint(reported) and packed | set(reported) == set(range(len(kinds)))
    want = {"good": None, "bomb": "image_too_large", "truncated": "bad_media", "not_image": "bad_media",
            "dotdot": "media_outside_root", "absolute_out": "media_outside_root",
            "symlink_out": "media_outside_root", "missing": "missing_image"}
    assert [reported.get(i) for i in range(len(kinds))] == [want[k] for k in kinds]
    # records are read (references resolved) before images are opened: a reading error comes first
    read_bad = [i for i, k in enumerate(kinds) if want[k] in ("media_outside_root", "missing_image")]
    first_bad = read_bad[0] if read_bad else next((i for i, k in enumerate(kinds) if k != "good"), None)
    try:
        prepare_multimodal(str(path), tok, seq_length=512, image_processor=small)
    except ValueError as e:  # DataFormatError (reading) or the media stage's ValueError
        msg = str(e)
        assert path.name in msg and "Fix:" in msg and "Traceback" not in msg, msg
        line = first_bad + 1
        assert f"line {line}" in msg or f"{path.name}:{first_bad}" in msg, msg
    else:
        assert first_bad is None
