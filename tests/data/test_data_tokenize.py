"""Chat-template tokenization, assistant-only labels and the over-length policy (seqpack.data.chat_template, seqpack.data.length_policy).

Cases from public-failures.md covered here (data side): B04, B05, B06, B09, B10, B11, B12.
Packed expectations are expressed by concatenating ``Sample.labels`` (the packed-row builder
copies per-sample labels unchanged, so the concatenation is the packed row's label column).
"""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.data import (
    IGNORE_INDEX,
    Conversation,
    OverlengthError,
    TemplateMarkers,
    apply_overlength,
    prepare,
    render_conversation,
)

from _helpers import trained_runs


QWEN_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)


def assert_trained_is_assistant_turns(tok, sample):
    """Independent oracle for Qwen3: the trained tokens decode to exactly the assistant turns."""
    text = tok.decode(sample.input_ids.tolist())
    expected = QWEN_ASSISTANT.findall(text)
    got = [tok.decode(r) for r in trained_runs(sample.labels)]
    assert got == expected, (sample.sample_id, got, expected)


def unshifted_mask(labels: np.ndarray) -> np.ndarray:
    """Per-token 'is a target' mask of one sample from its shifted labels (token t+1 <- label t)."""
    m = np.zeros(labels.shape[0], dtype=bool)
    m[1:] = labels[:-1] != IGNORE_INDEX
    return m


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------------------------ template


def test_qwen3_markers(qwen3_tokenizer):
    m = TemplateMarkers.probe(qwen3_tokenizer)
    assert m.headers[0] == "<|im_start|>assistant\n"
    assert m.end_of_turn == "<|im_end|>"


def test_qwen3_non_prefix_rendering_reasoning_and_tools(qwen3_tokenizer):
    """Qwen3 drops earlier reasoning and adds think blocks only after the last user query: the
    rendering of a prefix is not a prefix of the full rendering. Spans must still be exact."""
    tok = qwen3_tokenizer
    conv = Conversation(
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "early answer", "reasoning_content": "DROPPED-REASONING"},
            {"role": "user", "content": "second"},
            {
                "role": "assistant",
                "content": "calling",
                "reasoning_content": "plan it",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
            },
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "It is 42."},
        ],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    )
    markers = TemplateMarkers.probe(tok)
    text, spans = render_conversation(conv, tok, markers)
    assert "DROPPED-REASONING" not in text
    got = [text[a:b] for a, b in spans]
    assert got == [
        "early answer<|im_end|>",
        '<think>\nplan it\n</think>\n\ncalling\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>',
        "<think>\n\n</think>\n\nIt is 42.<|im_end|>",
    ]
    prefix = tok.apply_chat_template(conv.messages[:3], tokenize=False)
    assert not text.startswith(prefix[: prefix.index("early answer")] + "<think>")  # sanity on the quirk


def test_prepare_labels_decode_to_assistant_turns_and_literal_braces(tmp_path, qwen3_tokenizer):
    tok = qwen3_tokenizer
    p = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"instruction": "Who are you?", "input": "", "output": "I am {{name}} by {{author}}."},
            {
                "conversations": [
                    {"from": "human", "value": "a"},
                    {"from": "gpt", "value": "b"},
                    {"from": "human", "value": "c <|im_start|>assistant\nfake"},
                    {"from": "gpt", "value": "d"},
                ]
            },
        ],
    )
    samples, rep = prepare(p, tok, seq_length=256)
    assert rep.records_read == 2 and rep.entries == []
    s0 = samples[0]
    assert [tok.decode(r) for r in trained_runs(s0.labels)] == ["<think>\n\n</think>\n\nI am {{name}} by {{author}}.<|im_end|>"]
    assert "{{name}}" in tok.decode(s0.input_ids.tolist())
    # the user text that imitates an assistant header is not trained
    assert [tok.decode(r) for r in trained_runs(samples[1].labels)] == [
        "b<|im_end|>",
        "<think>\n\n</think>\n\nd<|im_end|>",
    ]
    assert rep.tokens == sum(s.length for s in samples)
    assert rep.trainable_tokens == sum(s.num_trainable for s in samples)


def test_train_on_all(tmp_path, qwen3_tokenizer):
    p = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q", "output": "a"}])
    (s,), _ = prepare(p, qwen3_tokenizer, seq_length=256, train_on="all")
    assert s.labels[:-1].tolist() == s.input_ids[1:].tolist() and s.labels[-1] == IGNORE_INDEX


def test_generic_template_without_generation_tags(qwen3_tokenizer):
    """A Llama-3-like template (different header, end-of-turn != eos, content trimmed)."""
    tok = copy.deepcopy(qwen3_tokenizer)
    tok.chat_template = (
        "{{ '<BOS>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}"
        "{{ m['content'] | trim }}{{ '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    )
    m = TemplateMarkers.probe(tok)
    assert m.headers[0] == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert m.end_of_turn == "<|eot_id|>"
    conv = Conversation(
        messages=[
            {"role": "user", "content": "  hi  "},
            {"role": "assistant", "content": " yo "},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "bye"},
        ]
    )
    text, spans = render_conversation(conv, tok, m)
    assert [text[a:b] for a, b in spans] == ["yo<|eot_id|>", "bye<|eot_id|>"]


# ------------------------------------------------------------------------------ public cases


def test_B04_real_length_from_metadata_not_eos_scan():
    u1, u2, EOS, a1, a2 = 11, 12, 2, 21, 22
    ids = np.array([u1, u2, EOS, a1, a2, EOS])
    (s,), entries = apply_overlength(ids, np.array([0, 0, 0, 1, 1, 1], bool), seq_length=32, sample_id="b04")
    assert entries == []
    assert s.length == 6 == len(s.input_ids)  # not 3 (first EOS)
    # inputs ids[:-1] predict labels ids[1:] masked like the labels: [0,0,1,1,1]
    assert s.labels[:-1].tolist() == [IGNORE_INDEX, IGNORE_INDEX, a1, a2, EOS]
    assert s.labels[-1] == IGNORE_INDEX and s.num_trainable == 3


def test_B04_real_qwen3_sample_with_repeated_end_of_turn(tmp_path, qwen3_tokenizer):
    tok = qwen3_tokenizer
    p = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q", "output": "a", "system": "s"}])
    (s,), _ = prepare(p, tok, seq_length=256)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    first = int(np.flatnonzero(s.input_ids == eot)[0])
    assert s.length == len(s.input_ids) > first + 1
    assert int(np.count_nonzero(s.input_ids == eot)) == 3
    assert s.labels[s.length - 3] == eot  # final end-of-turn is a target (followed by "\n")


def test_B05_spans_offset_by_sample_length():
    # A: length 12, trained tokens [6,10); B: length 8, trained tokens [5,8)
    ta = np.zeros(12, bool)
    ta[6:10] = True
    tb = np.zeros(8, bool)
    tb[5:8] = True
    (a,), _ = apply_overlength(np.arange(100, 112), ta, seq_length=20, sample_id="A")
    (b,), _ = apply_overlength(np.arange(200, 208), tb, seq_length=20, sample_id="B")
    packed_mask = np.concatenate([unshifted_mask(a.labels), unshifted_mask(b.labels)])
    assert np.flatnonzero(packed_mask).tolist() == [6, 7, 8, 9, 17, 18, 19]
    packed_labels = np.concatenate([a.labels, b.labels])
    assert int((packed_labels != IGNORE_INDEX).sum()) == 7


def test_B05_real_multiturn_spans_after_concatenation(tmp_path, qwen3_tokenizer):
    tok = qwen3_tokenizer
    conv = lambda k: {  # noqa: E731
        "conversations": [
            {"from": "human", "value": f"question {k}"},
            {"from": "gpt", "value": f"answer {k}"},
            {"from": "human", "value": f"more {k}"},
            {"from": "gpt", "value": f"final {k}"},
        ]
    }
    samples, _ = prepare(write_jsonl(tmp_path / "d.jsonl", [conv(1), conv(2)]), tok, seq_length=256)
    packed = np.concatenate([s.labels for s in samples])
    runs = [tok.decode(r) for r in trained_runs(packed)]
    assert runs == [
        "answer 1<|im_end|>",
        "<think>\n\n</think>\n\nfinal 1<|im_end|>",
        "answer 2<|im_end|>",
        "<think>\n\n</think>\n\nfinal 2<|im_end|>",
    ]
    off = samples[0].length
    assert np.flatnonzero(packed[off:] != IGNORE_INDEX).tolist() == np.flatnonzero(
        samples[1].labels != IGNORE_INDEX
    ).tolist()


def test_B06_assistant_mask_travels_with_the_sample(tmp_path, qwen3_tokenizer):
    mask = np.array([0, 0, 0, 1, 1], bool)
    a, _ = apply_overlength(np.array([1, 2, 3, 4, 5]), mask, seq_length=10, sample_id="a")
    b, _ = apply_overlength(np.array([6, 7, 8, 9, 10]), mask, seq_length=10, sample_id="b")
    packed = np.concatenate([a[0].labels, b[0].labels])
    assert np.concatenate([unshifted_mask(a[0].labels), unshifted_mask(b[0].labels)]).astype(int).tolist() == [
        0, 0, 0, 1, 1, 0, 0, 0, 1, 1
    ]
    assert int((packed != IGNORE_INDEX).sum()) == 4 == a[0].num_trainable + b[0].num_trainable
    # real: the prompt of a prepared sample is not trained
    p = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q " * 20, "output": "a"}])
    (s,), _ = prepare(p, qwen3_tokenizer, seq_length=256)
    assert 0 < s.num_trainable < s.length - 20


def _b09_inputs():
    toks = [np.arange(1, 6), np.arange(6, 8), np.arange(8, 11), np.arange(11, 12)]
    return [(t, np.ones(len(t), bool)) for t in toks]


def test_B09_truncate_is_default_and_reports_dropped_tokens():
    import inspect

    assert inspect.signature(prepare).parameters["overlength"].default == "truncate"
    out, entries = [], []
    for i, (ids, tr) in enumerate(_b09_inputs()):
        # keep_untrainable: the 1-token sample [11] has no next-token target (B09 packs it anyway)
        s, e = apply_overlength(ids, tr, seq_length=4, sample_id=f"s{i}", keep_untrainable=True)
        out += s
        entries += [x for x in e if x.status != "kept"]
    assert [s.input_ids.tolist() for s in out] == [[1, 2, 3, 4], [6, 7], [8, 9, 10], [11]]
    (e,) = entries
    assert (e.sample_id, e.status, e.reason, e.tokens_before, e.tokens_after) == ("s0", "truncated", "overlength", 5, 4)
    assert sum(x.tokens_before - x.tokens_after for x in entries) == 1
    assert out[0].labels.tolist() == [2, 3, 4, 5]  # B12: first dropped token kept as final target
    # by default the 1-token sample (nothing to predict) is dropped and reported, not lost silently
    s, (e,) = apply_overlength(*_b09_inputs()[3], seq_length=4, sample_id="s3")
    assert s == [] and (e.status, e.reason, e.tokens_before) == ("dropped", "no_trainable_tokens", 1)


def test_B09_split_keeps_every_token_once_and_drop_error():
    out, entries = [], []
    for i, (ids, tr) in enumerate(_b09_inputs()):
        s, e = apply_overlength(ids, tr, seq_length=4, overlength="split", sample_id=f"s{i}", keep_untrainable=True)
        out += s
        entries += [x for x in e if x.status != "kept"]
    assert [s.sample_id for s in out] == ["s0#part0", "s0#part1", "s1", "s2", "s3"]
    assert [s.input_ids.tolist() for s in out] == [[1, 2, 3, 4], [5], [6, 7], [8, 9, 10], [11]]
    assert sorted(np.concatenate([s.input_ids for s in out]).tolist()) == list(range(1, 12))
    assert [(e.status, e.tokens_before, e.tokens_after) for e in entries] == [("split", 5, 5)]
    ids, tr = _b09_inputs()[0]
    s, e = apply_overlength(ids, tr, seq_length=4, overlength="drop", sample_id="s0")
    assert s == [] and (e[0].status, e[0].reason, e[0].tokens_before, e[0].tokens_after) == ("dropped", "overlength", 5, 0)
    with pytest.raises(OverlengthError, match="s0.*5 tokens > seq_length=4"):
        apply_overlength(ids, tr, seq_length=4, overlength="error", sample_id="s0")


def test_B10_split_121_at_60():
    ids = np.arange(1000, 1121)
    out, (entry,) = apply_overlength(ids, np.ones(121, bool), seq_length=60, overlength="split", sample_id="x")
    assert [s.length for s in out] == [60, 60, 1]
    assert [s.sample_id for s in out] == ["x#part0", "x#part1", "x#part2"]
    assert np.concatenate([s.input_ids for s in out]).tolist() == ids.tolist()
    # every next-token transition is trained exactly once across fragments
    labels = np.concatenate([s.labels for s in out])
    assert labels[:-1].tolist() == ids[1:].tolist() and labels[-1] == IGNORE_INDEX
    assert "3 fragments" in entry.detail and "1 fragment(s) have no trainable label" in entry.detail


@settings(deadline=None, max_examples=60)
@given(n=st.integers(1, 200), cap=st.integers(1, 64), mask=st.lists(st.booleans(), min_size=200, max_size=200))
def test_B10_split_property_any_multiple(n, cap, mask):
    ids = np.arange(n) + 5
    tr = np.array(mask[:n])
    out, _ = apply_overlength(ids, tr, seq_length=cap, overlength="split", sample_id="p", keep_untrainable=True)
    k, r = divmod(n, cap)
    assert [s.length for s in out] == [cap] * k + ([r] if r else [])
    assert np.concatenate([s.input_ids for s in out]).tolist() == ids.tolist()
    labels = np.concatenate([s.labels for s in out])
    expect = np.where(tr[1:], ids[1:], IGNORE_INDEX).tolist() + [IGNORE_INDEX]
    assert labels.tolist() == expect


@settings(deadline=None, max_examples=60)
@given(n=st.integers(1, 200), cap=st.integers(1, 64), mask=st.lists(st.booleans(), min_size=200, max_size=200),
       policy=st.sampled_from(["truncate", "drop", "split"]))
def test_B11_stored_length_is_final_length_property(n, cap, mask, policy):
    tr = np.array(mask[:n])
    out, entries = apply_overlength(np.arange(n), tr, seq_length=cap, overlength=policy, sample_id="p")
    assert out or entries  # nothing lost silently: a sample or a report entry
    if out:
        # tokens kept in order: split keeps every token once, truncate the first cap, short samples all
        kept = n if policy == "split" or n <= cap else cap
        assert np.array_equal(np.concatenate([s.input_ids for s in out]), np.arange(kept))
        assert policy == "split" or len(out) == 1
    for s in out:
        assert s.length == len(s.input_ids) == len(s.labels) <= cap
        if policy != "split":
            assert s.num_trainable > 0
    for e in entries:
        if e.status == "dropped":
            assert e.tokens_after == 0
        if e.status == "truncated":
            assert (e.tokens_before, e.tokens_after) == (n, cap)


def test_B11_long_prompt_stub_dropped_not_charged(tmp_path, qwen3_tokenizer):
    tok = qwen3_tokenizer
    long_user = " ".join(["word"] * 10000)
    p = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"instruction": long_user, "output": "short"},  # assistant beyond 4096 -> nothing to train
            {"instruction": "q", "output": long_user},  # long answer -> truncated, trainable
        ],
    )
    samples, rep = prepare(p, tok, seq_length=4096)
    assert rep.records_read == 2 and [s.sample_id for s in samples] == ["d.jsonl:1"]
    stub, trunc = rep.entries
    assert (stub.sample_id, stub.status, stub.reason, stub.tokens_after) == ("d.jsonl:0", "dropped", "no_trainable_tokens", 0)
    assert stub.tokens_before > 10000
    assert (trunc.status, trunc.tokens_after) == ("truncated", 4096) and trunc.tokens_before > 10000
    (s,) = samples
    assert s.length == len(s.input_ids) == 4096 and rep.tokens == 4096
    assert s.meta["truncated_from"] == trunc.tokens_before
    kept, rep2 = prepare(p, tok, seq_length=4096, keep_untrainable=True)
    assert len(kept) == 2 and kept[0].num_trainable == 0 and rep2.count("kept", "no_trainable_tokens") == 1


def test_B12_truncation_keeps_first_dropped_token_as_final_target():
    ids = np.arange(100, 117)  # stored 17
    s, _ = apply_overlength(ids, np.ones(17, bool), seq_length=16, sample_id="t")
    assert s[0].length == 16 and s[0].labels.tolist() == ids[1:17].tolist()
    assert s[0].num_trainable == 16  # runtime length 16, no label lost
    big = np.arange(150001)
    s, _ = apply_overlength(big, np.ones(150001, bool), seq_length=150000, sample_id="big")
    assert s[0].length == 150000 and s[0].labels[-1] == 150000 and s[0].num_trainable == 150000
    # untrainable first dropped token -> no final target
    tr = np.ones(17, bool)
    tr[16] = False
    s, _ = apply_overlength(ids, tr, seq_length=16, sample_id="t")
    assert s[0].labels[-1] == IGNORE_INDEX


def test_B12_real_truncation_final_target(tmp_path, qwen3_tokenizer):
    tok = qwen3_tokenizer
    p = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q", "output": "one two three four five six seven"}])
    (full,), _ = prepare(p, tok, seq_length=4096)
    L = full.length
    (cut,), rep = prepare(p, tok, seq_length=L - 4)
    assert cut.length == L - 4
    assert cut.labels.tolist() == full.labels[: L - 4].tolist()  # includes the target of the last slot
    assert cut.labels[-1] == full.input_ids[L - 4] != IGNORE_INDEX
    assert rep.entries[0].tokens_before == L and rep.entries[0].tokens_after == L - 4


def test_media_sample_is_not_cut(tmp_path, qwen3_tokenizer):
    (tmp_path / "a.jpg").write_bytes(b"x")
    rec = {"images": ["a.jpg"], "messages": [{"role": "user", "content": "<image>" + " hi" * 50},
                                            {"role": "assistant", "content": "ok"}]}
    p = write_jsonl(tmp_path / "d.jsonl", [rec])
    (s,), _ = prepare(p, qwen3_tokenizer, seq_length=4096, keep_image_placeholders=True)
    assert s.media == {"images": [str(tmp_path / "a.jpg")]}
    assert "<image>" in qwen3_tokenizer.decode(s.input_ids.tolist())
    out, rep = prepare(p, qwen3_tokenizer, seq_length=20, keep_image_placeholders=True)
    assert out == [] and rep.entries[0].reason == "overlength_media"


def test_encode_texts_matches_transformers_call(qwen3_tokenizer):
    from seqpack.data import encode_texts

    tok = qwen3_tokenizer
    texts = ["<|im_start|>user\nhé {{x}}<|im_end|>\n", "  spaces\n\n\ttabs 123456 ", ""]
    got = encode_texts(tok, texts, [[(0, 5)], [], []])
    ref = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    for (ids, tr), r_ids, r_off in zip(got, ref["input_ids"], ref["offset_mapping"]):
        assert ids.tolist() == r_ids
    assert got[0][1].tolist() == [o[0] < 5 for o in ref["offset_mapping"][0]]
    assert not got[1][1].any() and got[2][0].shape == (0,)
    assert all(tr.all() for _, tr in encode_texts(tok, texts[:2], [[], []], train_on="all"))


_SAME = ["llama3", "gemma3", "cohere", "cohere2", "phi3", "phi3_5", "diffusion_gemma"]
_SAME_BUT_NEWLINE = ["qwen3", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8", "qwen3_instruct_2507",
                     "qwen3_vl", "lfm2", "nemotron_3_nano"]


@pytest.mark.parametrize("name", _SAME + _SAME_BUT_NEWLINE)
def test_spans_agree_with_generation_tags_of_trl_training_templates(qwen3_tokenizer, name):
    """Cross-check against an independent oracle: TRL's *_training.jinja templates mark assistant
    output with {% generation %}, which HF turns into assistant_masks. Our template-agnostic spans
    (computed without those tags) must give the same mask; TRL's Qwen-style templates also train
    the newline after <|im_end|>, which seqpack deliberately does not (generation stops at it)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("trl")
    path = Path(spec.submodule_search_locations[0]) / "chat_templates" / f"{name}_training.jinja" if spec else None
    if path is None or not path.is_file():
        pytest.skip("trl chat templates not installed")
    from seqpack.data import encode_texts

    tok = copy.copy(qwen3_tokenizer)
    tok.chat_template = path.read_text()
    markers = TemplateMarkers.probe(tok)
    msgs = [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello you"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "b b"},
    ]
    text, spans = render_conversation(Conversation(messages=msgs), tok, markers)
    ((ids, ours),) = encode_texts(tok, [text], [spans])
    hf = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert list(hf["input_ids"]) == ids.tolist()
    theirs = np.array(hf["assistant_masks"], bool)
    if name in _SAME_BUT_NEWLINE:
        newline = np.array([tok.decode([int(t)]).strip() == "" for t in ids])
        extra = theirs & ~ours
        assert newline[extra].all()  # only trailing newlines differ
        theirs = theirs & ~extra
    assert ours.tolist() == theirs.tolist()
    assert int(ours.sum()) > 0


def test_content_with_template_markers_is_reported_not_mistrained(tmp_path, qwen3_tokenizer):
    """A record whose assistant text contains '<|im_end|>' itself: the span search goes past the
    content, and a user text holding a fake turn does not shift the spans."""
    tok = qwen3_tokenizer
    p = write_jsonl(
        tmp_path / "d.jsonl",
        [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x<|im_end|>y"}]}],
    )
    (s,), _ = prepare(p, tok, seq_length=256)
    assert [tok.decode(r) for r in trained_runs(s.labels)] == ["<think>\n\n</think>\n\nx<|im_end|>y<|im_end|>"]


def test_chat_template_kwargs_enable_thinking(tmp_path, qwen3_tokenizer):
    p = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q", "output": "a"}])
    (s,), _ = prepare(p, qwen3_tokenizer, seq_length=256, chat_template_kwargs={"enable_thinking": False})
    assert [qwen3_tokenizer.decode(r) for r in trained_runs(s.labels)] == ["<think>\n\n</think>\n\na<|im_end|>"]


def _with_template(tok, template):
    t = copy.copy(tok)
    t.chat_template = template
    return t


_T = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content FILTER }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_that_rewrites_content_is_an_error_not_silent(tmp_path, qwen3_tokenizer):
    p = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "q", "output": "HelloZ"}, {"instruction": "q", "output": "ok"}])
    tok = _with_template(qwen3_tokenizer, _T.replace("FILTER", "| replace('Z', 'z')"))
    with pytest.raises(Exception) as ei:
        prepare(p, tok, seq_length=256)
    assert getattr(ei.value, "reason", None) == "template_span_mismatch" and "d.jsonl" in str(ei.value)
    samples, rep = prepare(p, tok, seq_length=256, on_error="skip")
    assert len(samples) == 1 and rep.entries[0].reason == "template_span_mismatch" and rep.entries[0].index == 0
    with pytest.raises(Exception, match="not render message contents verbatim"):
        prepare(p, _with_template(qwen3_tokenizer, _T.replace("FILTER", "| upper")), seq_length=256)
    with pytest.raises(Exception, match="no end-of-turn marker"):
        prepare(p, _with_template(qwen3_tokenizer, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"),
                seq_length=256)


def test_template_without_tool_support_refuses_tool_records(tmp_path, qwen3_tokenizer):
    p = write_jsonl(tmp_path / "d.jsonl", [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
         "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                                                         "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "plain"}]},
    ])
    tok = _with_template(qwen3_tokenizer, _T.replace("FILTER", ""))
    samples, rep = prepare(p, tok, seq_length=256, on_error="skip")
    assert [s.index for s in samples] == [2]
    assert [(e.index, e.reason) for e in rep.entries] == [(0, "template_unsupported"), (1, "template_unsupported")]
    assert "tools" in rep.entries[0].detail and "tool_calls" in rep.entries[1].detail
