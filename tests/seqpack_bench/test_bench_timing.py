"""seqpack_bench.timing: medians of repeats, the JSON writer, the output-folder check, charts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqpack_bench.timing import Timing, timed, write_json


def test_timed_returns_median_of_repeats_and_last_result():
    calls = []

    def fn():
        calls.append(1)
        return len(calls)

    res, t = timed(fn, repeats=3, warmup=2)
    assert res == 5 and len(calls) == 5  # 2 untimed + 3 timed, last result returned
    assert isinstance(t, Timing) and t.repeats == 3 and len(t.walls_s) == 3
    assert t.wall_s == sorted(t.walls_s)[1] and t.wall_s >= 0 and t.cpu_s >= 0
    with pytest.raises(ValueError, match="repeats"):
        timed(fn, repeats=0)


def test_write_json_converts_numpy_and_non_finite(tmp_path):
    p = write_json(tmp_path / "a" / "x.json", {"n": np.int64(3), "v": np.array([1.5, 2.0]), "bad": float("nan")})
    data = json.loads(p.read_text())
    assert data["n"] == 3 and data["v"] == [1.5, 2.0] and data["bad"] is None
    assert data["machine"]["cpu_count"] >= 1 and "utc" in data["machine"]


def test_ensure_out_dir_creates_checks_and_names_the_option(tmp_path):
    from seqpack_bench.timing import OutputDirError, ensure_out_dir

    made = ensure_out_dir(tmp_path / "a" / "b")
    assert made.is_dir() and list(made.iterdir()) == []  # created; the write probe left nothing behind
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(OutputDirError, match=r"^--out .*file\.txt/x: cannot create this folder \(.*file\.txt is a file"):
        ensure_out_dir(blocker / "x")
    with pytest.raises(OutputDirError, match=r"^out_dir .*file\.txt: this is a file, not a folder"):
        ensure_out_dir(blocker, option="out_dir")


def test_ensure_out_dir_refuses_empty_text(tmp_path):
    from seqpack_bench.timing import OutputDirError, ensure_out_dir

    for empty in ("", " "):
        with pytest.raises(OutputDirError, match=r"^out_dir is empty"):
            ensure_out_dir(empty, option="out_dir")
    assert ensure_out_dir(str(tmp_path / "ok")).is_dir()


def test_bar_chart_with_many_bars_is_horizontal_and_grows_in_height(tmp_path):
    from PIL import Image

    from seqpack_bench.timing import bar_chart

    def size(n):
        labels = [f"megatron-bridge 0.3.1 first_fit_shuffle, n={i:,}" for i in range(n)]
        p = bar_chart(tmp_path / f"b{n}.png", labels, [10.0 ** (i % 4) for i in range(n)], title="t", ylabel="s",
                      log=True, annotate=[str(i) for i in range(n)])
        with Image.open(p) as im:
            return im.size

    w8, h8 = size(8)
    w16, h16 = size(16)
    assert w16 == w8 and w16 < 1200  # width set by the labels, not by the number of bars
    assert h16 > h8 + 200 and h16 > 16 * 25  # about 0.3 inch (33 px) of height per bar
    w3, h3 = size(3)
    assert h3 == 440  # few bars: vertical columns as before (4 inches at 110 dpi)
