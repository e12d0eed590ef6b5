"""``num_proc``: records prepared in worker processes give the same output, report and errors as in
this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqpack.data import DataFormatError
from seqpack.pipeline import pack_dataset
from seqpack.pipeline.job import PackConfigError, PackJob


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_real_file_packs_byte_identical_with_two_processes(shared_data, tmp_path):
    src = shared_data / "llama-factory" / "alpaca_en_demo.json"
    outs = {}
    for n in (1, 2):
        res = pack_dataset(src, tmp_path / f"p{n}", seq_length=2048, num_proc=n)
        assert res.num_packs > 0
        outs[n] = _files(tmp_path / f"p{n}")
    assert outs[1].keys() == outs[2].keys() and any(k.endswith(".parquet") for k in outs[1])
    for name in outs[1]:
        if name == "metadata.json":
            m1, m2 = (json.loads(outs[n][name]) for n in (1, 2))
            assert m1["fingerprint"] == m2["fingerprint"]
            assert {k: v for k, v in m1.items() if k != "created_at"} == {k: v for k, v in m2.items() if k != "created_at"}
        else:
            assert outs[1][name] == outs[2][name], name


def _chats(n: int) -> list[str]:
    return [json.dumps({"instruction": f"say {i}", "input": "", "output": f"{i} " * (i % 7 + 1)}) for i in range(n)]


def test_bad_record_in_a_worker_raises_as_in_process(tmp_path):
    lines = _chats(700)
    lines[611] = json.dumps({"nothing": "known"})
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(lines) + "\n")
    errors = {}
    for n in (1, 2):
        with pytest.raises(DataFormatError) as exc:
            pack_dataset(src, tmp_path / f"o{n}", seq_length=512, num_proc=n)
        errors[n] = exc.value
        assert not (tmp_path / f"o{n}").exists()
    assert type(errors[1]) is type(errors[2]) and str(errors[1]) == str(errors[2])
    assert "d.jsonl" in str(errors[2]) and "line 612" in str(errors[2])
    assert (errors[1].reason, errors[1].line) == (errors[2].reason, errors[2].line)
    # skipped instead: the same report entries, in the same order
    reports = {}
    for n in (1, 2):
        pack_dataset(src, tmp_path / f"s{n}", seq_length=512, num_proc=n, on_error="skip")
        reports[n] = (tmp_path / f"s{n}" / "report.jsonl").read_bytes()
    assert reports[1] == reports[2] and b"d.jsonl:611" in reports[1]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_num_proc_is_checked_before_any_work(tmp_path, bad):
    with pytest.raises(PackConfigError, match=r"^num_proc must be an integer >= 1"):
        PackJob.create(None, tmp_path / "o", num_proc=bad)


def test_num_proc_defaults_to_automatic(tmp_path):
    assert PackJob.create(None, tmp_path / "o").num_proc is None
    assert PackJob.create(None, tmp_path / "o", num_proc=3).num_proc == 3


def test_a_dead_worker_raises_instead_of_hanging():
    import os
    import signal

    from seqpack.data.procs import WorkerDiedError, WorkerProcesses

    # init = os.getpid (the worker's state is its pid), run = os.kill(pid, sig): the worker kills itself
    procs = WorkerProcesses(2, os.getpid, (), os.kill)
    try:
        tid = procs.submit(signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match=r"was killed by SIGKILL \(the out-of-memory killer sends it\) while "
                                                  r"records 7 were being prepared.*Fix: use fewer processes"):
            procs.result(tid, lambda: "records 7")
        assert procs.procs == []  # the others were stopped
    finally:
        procs.close(kill=True)
    procs = WorkerProcesses(1, int, (0,), os._exit)  # run = os._exit(0): ends without a result
    with pytest.raises(WorkerDiedError, match="exited with code 0"):
        procs.result(procs.submit())
    procs = WorkerProcesses(1, int, ("not a number",), os.kill)  # init raises in the worker
    with pytest.raises(WorkerDiedError, match="(?s)could not start:.*ValueError: invalid literal"):
        procs.result(procs.submit())


def test_automatic_num_proc_starts_workers_only_for_large_inputs(qwen3_tokenizer):
    from seqpack.data.chat_template import TemplateMarkers
    from seqpack.data.records import RawRecord
    from seqpack.data.workers import AUTO_MIN_RECORDS, ChunkSettings, PreparePool, prepare_chunk

    settings = ChunkSettings(TemplateMarkers.probe(qwen3_tokenizer), None, None, "assistant", 4096, "truncate", False)
    recs = [(RawRecord(json.loads(line), "r", i), f"r:{i}") for i, line in enumerate(_chats(600))]
    chunks = [recs[i:i + 256] for i in range(0, len(recs), 256)]
    want = [prepare_chunk(qwen3_tokenizer, settings, c) for c in chunks]
    with PreparePool(None, qwen3_tokenizer) as pool:
        assert pool.auto and pool.min_records == AUTO_MIN_RECORDS > len(recs)
        got = list(pool.map_chunks(settings, chunks))
        assert not pool.started and pool.records_seen == 600  # small input: prepared in this process
    with PreparePool(None, qwen3_tokenizer) as pool:
        pool.num_proc, pool.min_records, pool.min_seconds = 2, 256, 0.0  # 2 cores, start after the first chunk
        got2 = list(pool.map_chunks(settings, chunks))
        assert pool.started and pool.records_seen == 600
    for a, b, c in zip(want, got, got2):
        for oa, ob, oc in zip(a, b, c):
            (sa,), (sb,), (sc,) = oa[1], ob[1], oc[1]
            assert sa.sample_id == sb.sample_id == sc.sample_id
            assert sa.input_ids.tolist() == sb.input_ids.tolist() == sc.input_ids.tolist()
            assert sa.labels.tolist() == sb.labels.tolist() == sc.labels.tolist()


@pytest.mark.parametrize("cores, want", [(1, 1), (2, 1), (3, 1), (4, 4), (16, 16)])
def test_automatic_num_proc_uses_workers_only_on_enough_cores(qwen3_tokenizer, monkeypatch, cores, want):
    import seqpack.data.workers as workers

    monkeypatch.setattr(workers, "available_cores", lambda: cores)
    assert workers.PreparePool(None, qwen3_tokenizer).num_proc == want
    assert workers.PreparePool(2, qwen3_tokenizer).num_proc == 2  # an explicit count is kept


def test_a_script_without_main_guard_runs_once_with_workers(tmp_path):
    import os
    import subprocess
    import sys

    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(_chats(600)) + "\n")
    script = tmp_path / "job.py"
    script.write_text(
        "from seqpack.pipeline import pack_dataset\n"
        "print('job starts', flush=True)\n"
        f"r = pack_dataset({str(src)!r}, {str(tmp_path / 'out')!r}, seq_length=512, num_proc=2)\n"
        "print('packs', r.num_packs, flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("job starts") == 1 and out.stdout.count("packs ") == 1


def test_progress_totals_for_json_arrays(tmp_path):
    recs = [json.loads(line) for line in _chats(300)]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(recs[:200]))
    b.write_text(json.dumps(recs[200:]))
    seen: list = []
    pack_dataset(a, tmp_path / "o1", seq_length=512, progress=lambda st, d, t: seen.append((st, d, t)))
    prep = [(d, t) for st, d, t in seen if st == "prepare"]
    assert prep and all(t == 200 for _, t in prep) and prep[-1][0] == 200  # known once the array is parsed
    seen.clear()
    pack_dataset([a, b], tmp_path / "o2", seq_length=512, progress=lambda st, d, t: seen.append((st, d, t)))
    prep = [(d, t) for st, d, t in seen if st == "prepare"]
    # b.json estimated from its size at a.json's records per byte until it is parsed, then exact
    assert all(t is not None for _, t in prep) and prep[-1] == (300, 300)
    assert abs(prep[0][1] - 300) <= 10


def test_record_counts_estimates_unparsed_json_files(tmp_path):
    from seqpack.data.prepare import RecordCounts

    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.jsonl"
    a.write_text(json.dumps([{"x": 1}] * 10))
    b.write_text(json.dumps([{"x": 1}] * 20))
    c.write_text('{"x": 1}\n\n{"x": 2}\n')
    counts = RecordCounts([c, a, b])
    assert counts.counts == [2, None, None] and counts.total() is None  # no .json parsed yet: no estimate
    counts.learn(1, 10)
    assert counts.total() == 2 + 10 + round(b.stat().st_size * 10 / a.stat().st_size)
    counts.learn(2, 20)
    assert counts.total() == 32


def test_workers_end_when_their_parent_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import os, time\n"
        "from seqpack.data.procs import WorkerProcesses\n"
        "w = WorkerProcesses(2, int, (0,), os.kill)\n"
        "print(' '.join(str(p.pid) for p in w.procs), flush=True)\n"
        "time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] != "Z"  # a zombie has ended
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 60
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
