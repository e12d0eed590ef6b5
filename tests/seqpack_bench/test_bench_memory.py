"""`seqpack bench memory`: inputs, the per-process peak measurement and the report structure (no timings)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from _bench_cli import _cli, _forbid, _one_line_error
from seqpack_bench import bench_memory as bm


def test_build_inputs_sizes_and_records(tmp_path):
    inp = bm.build_inputs(tmp_path, [0.05], [7])
    assert inp["baseline"].read_text().count("\n") == 1
    path, nbytes = inp["large"][0.05]
    lines = path.read_text().splitlines()
    assert len(lines) == 5 and len(lines[2]) == nbytes
    assert len(json.loads(lines[2])["output"]) == 50_000
    assert inp["tiny"][7].read_text().splitlines() == ['{"instruction": "hi", "input": "", "output": "ok"}'] * 7


def test_peak_rss_is_that_of_the_child(tmp_path):
    grow = "b = bytearray(120 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    ballast = bytearray(300 * 2**20)  # this process is large: a child's figure must not include it
    ballast[::4096] = b"x" * len(ballast[::4096])
    small, _, rc0, _ = bm.peak_rss(["-c", "pass"])
    big, _, rc1, _ = bm.peak_rss(["-c", grow])
    assert rc0 == rc1 == 0
    assert 0 < small < 100 * 2**20
    assert 100 * 2**20 < big - small < 200 * 2**20  # the 120 MB the second child touched
    _, _, rc, tail = bm.peak_rss(["-c", "import sys; sys.exit('boom')"])
    assert rc == 1 and "boom" in tail
    del ballast


def test_run_memory_report_structure_and_verdicts(tmp_path, monkeypatch):
    # MB: two baseline runs (the first, cold, higher), then truncate / drop / split, then tiny
    peaks = iter([530, 500, 560, 500, 700, 520])
    monkeypatch.setattr(bm, "peak_rss", lambda cmd, env=None: (next(peaks) * 2**20, 1.0, 0, ""))
    lines: list[str] = []
    res = bm.run_memory(large_mb=[5], tiny=[100_000], out_dir=tmp_path, say=lines.append)
    assert res["baseline_mb"] == 500  # the lower of the two baseline runs
    assert lines[0] == "baseline (1 short record, lower of 2 runs): peak 500 MB (530, 500)"
    assert [r["policy"] for r in res["large"]] == ["truncate", "drop", "split"]
    truncate, drop, split = res["large"]
    nbytes = truncate["record_bytes"]
    assert truncate["above_mb"] == 60 and truncate["ratio"] == round(60 * 2**20 / nbytes, 2)
    assert drop["above_mb"] == 0 and split["above_mb"] == 200
    assert res["tiny"] == [{"records": 100_000, "peak_mb": 520, "above_mb": 20, "bytes_per_record": 209.7,
                            "seconds": 1.0}]
    assert res["verdicts"] == [
        f"PASS: 5 MB record, overlength=truncate: {truncate['ratio']:.1f}x its size (goal <= 20x)",
        "PASS: 5 MB record, overlength=drop: 0.0x its size (goal <= 20x)",
        f"MISS: 5 MB record, overlength=split: {split['ratio']:.1f}x its size (goal <= 20x)",
        "PASS: 100,000 tiny records: 210 B per record (goal <= 512 B)",
    ]
    assert lines[-4:] == res["verdicts"]
    assert json.loads((tmp_path / "memory.json").read_text()) == res


def test_failed_pack_run_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setattr(bm, "peak_rss", lambda cmd, env=None: (0, 0.0, 1, "error: no space left"))
    r = CliRunner().invoke(_cli(), ["bench", "memory", "--quick", "--out", str(tmp_path)])
    assert r.exit_code == 1
    assert "failed (exit 1): error: no space left" in _one_line_error(r)


def test_bad_option_refused_before_any_work(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack_bench.bench_memory", "run_memory")
    r = CliRunner().invoke(_cli(), ["bench", "memory", "--large-mb", "0", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--large-mb must list numbers > 0" in _one_line_error(r)
    assert calls == []
