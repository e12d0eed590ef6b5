"""The top-level package: light import, lazy names and subpackages as documented in the README."""

from __future__ import annotations

import os
import subprocess
import sys

import seqpack


def _run(code: str) -> str:
    # a fresh interpreter that finds the same seqpack (installed, or src/ via pytest's pythonpath)
    src = os.path.dirname(os.path.dirname(seqpack.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def test_import_seqpack_is_light():
    out = _run("import sys, seqpack; print(sorted(m for m in ('torch', 'transformers', 'pyarrow') if m in sys.modules))")
    assert out == "[]"


def test_subpackages_reachable_after_plain_import():
    """README snippets call ``seqpack.data.prepare`` / ``seqpack.io.load_packed`` after ``import seqpack``."""
    out = _run("import seqpack; print(seqpack.data.prepare.__name__, seqpack.io.load_packed.__name__, "
               "seqpack.parallel.slice_for_cp.__name__)")
    assert out == "prepare load_packed slice_for_cp"


def test_lazy_names_resolve_to_their_modules():
    import seqpack
    from seqpack.io import load_packed
    from seqpack.pipeline import pack_dataset

    assert seqpack.pack_dataset is pack_dataset and seqpack.load_packed is load_packed
    assert {"pack_dataset", "load_packed", "data", "io"} <= set(dir(seqpack))
    try:
        seqpack.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("unknown attribute did not raise")
