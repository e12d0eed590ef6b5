"""In-process preparation with the tokenizer call of one chunk overlapping the rendering of the next
(``seqpack.data.workers.prepare_chunks_overlapped``), and the sandbox look-up shortcuts of
``seqpack.data.template_env``: the same outcomes, texts and errors as without."""

from __future__ import annotations

import json

import numpy as np
import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

import seqpack.data as data
from seqpack.data.chat_template import TemplateMarkers
from seqpack.data.records import DataFormatError, RawRecord
from seqpack.data.template_env import _fast_class, speed_up_template
from seqpack.data.workers import ChunkSettings, prepare_chunk, prepare_chunks_overlapped


def _chunks(n_chunks: int, size: int, bad: int | None = None) -> list[list[tuple[RawRecord, str]]]:
    out = []
    for c in range(n_chunks):
        chunk = []
        for j in range(size):
            i = c * size + j
            rec = {"messages": [{"role": "user", "content": f"q {i} " * (i % 5 + 1)},
                                {"role": "assistant", "content": f"a {i} " * (i % 9 + 1)}]}
            if i == bad:
                rec = {"nothing": "known"}
            chunk.append((RawRecord(rec, "t.jsonl", i, i + 1), f"t.jsonl:{i}"))
        out.append(chunk)
    return out


def _settings(tok) -> ChunkSettings:
    return ChunkSettings(TemplateMarkers.probe(tok), None, None, "assistant", 2**31 - 1, "error", False)


def test_overlapped_outcomes_equal_chunk_by_chunk(qwen3_tokenizer):
    settings, chunks = _settings(qwen3_tokenizer), _chunks(4, 37, bad=50)
    got = list(prepare_chunks_overlapped(qwen3_tokenizer, settings, iter(chunks)))
    want = [prepare_chunk(qwen3_tokenizer, settings, c) for c in chunks]
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert [o[0] for o in g] == [o[0] for o in w]
        for og, ow in zip(g, w):
            if og[0] == "ok":
                (sg,), (sw,) = og[1], ow[1]
                assert sg.sample_id == sw.sample_id and sg.length == sw.length > 0
                assert np.array_equal(sg.input_ids, sw.input_ids) and np.array_equal(sg.labels, sw.labels)
            else:
                assert str(og[1]) == str(ow[1]) and og[2].reason == ow[2].reason
    assert got[1][50 - 37][0] == "bad"


def test_a_read_error_comes_after_the_chunks_read_before_it(qwen3_tokenizer):
    settings, chunks = _settings(qwen3_tokenizer), _chunks(2, 10)

    def read():
        yield from chunks
        raise OSError("disk gone")

    seen = []
    with pytest.raises(OSError, match="disk gone"):
        for outcomes in prepare_chunks_overlapped(qwen3_tokenizer, settings, read()):
            seen.append(outcomes)
    assert len(seen) == 2 and all(o[0] == "ok" for c in seen for o in c)


def test_a_bad_record_is_raised_before_a_bad_line_of_a_later_chunk(qwen3_tokenizer, tmp_path):
    lines = [json.dumps({"instruction": f"say {i}", "input": "", "output": f"{i}"}) for i in range(300)]
    lines[5] = json.dumps({"nothing": "known"})
    lines[250] = "{not json"
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError) as exc:
        data.prepare(src, qwen3_tokenizer, seq_length=512, batch_size=64, num_proc=1)
    assert exc.value.line == 6


def _tools_chat() -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "{\"temp\": 21}"},
            {"role": "assistant", "content": "<think>\nhot\n</think>\n\n21 degrees."}]


def test_fast_sandbox_renders_the_same_text(qwen3_tokenizer):
    from transformers.utils.chat_template_utils import _compile_jinja_template

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    template = qwen3_tokenizer.chat_template
    env = _compile_jinja_template(template).environment
    fast = _fast_class(ImmutableSandboxedEnvironment)
    renders = {}
    for cls in (ImmutableSandboxedEnvironment, fast):
        env.__class__ = cls
        renders[cls] = (qwen3_tokenizer.apply_chat_template(_tools_chat(), tools=tools, tokenize=False),
                        qwen3_tokenizer.apply_chat_template(_tools_chat()[1:2], tokenize=False,
                                                            add_generation_prompt=True))
    assert speed_up_template(template) and type(env) is fast
    a, b = renders.values()
    assert a == b and "<tool_call>" in a[0] and "get_weather" in a[0] and a[1].endswith("<|im_start|>assistant\n")


def test_fast_sandbox_keeps_the_sandbox_rules():
    env = ImmutableSandboxedEnvironment()
    env.__class__ = _fast_class(ImmutableSandboxedEnvironment)
    t = env.from_string("{{ m.content }}|{{ m.missing is defined }}|{{ m.get('content') }}|{{ m.items() | list | length }}")
    assert t.render(m={"content": "hi"}) == "hi|False|hi|1"
    assert env.from_string("{{ m.__class__ }}").render(m={}) == ""  # unsafe: undefined, as in the plain sandbox
    for bad in ("{{ m.__class__.__mro__ }}", "{{ x.append(1) }}"):
        with pytest.raises(SecurityError):
            env.from_string(bad).render(m={}, x=[])
    assert env.from_string("{{ m.keys }}").render(m={"keys": "item"}).startswith("<built-in method keys")
