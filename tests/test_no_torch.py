"""seqpack without PyTorch: the light API works and imports no torch; each torch entry point fails with one
ModuleNotFoundError naming the feature and the install command; an error from inside an installed torch
is left as it is. Each scenario runs in a fresh interpreter (the one running the tests has torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import seqpack
from seqpack._torch import TORCH_FIX, missing_torch_message

SRC = os.path.dirname(os.path.dirname(seqpack.__file__))

#: torch (and every torch.* module) not found by any meta-path finder, as on a minimal install:
#: ``import torch`` raises ModuleNotFoundError(name="torch") and ``importlib.util.find_spec("torch")`` is None
BLOCK_TORCH = textwrap.dedent("""
    import sys

    class _NoTorch:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                return None
            find = getattr(self.finder, "find_spec", None)
            return find(name, path, target) if find else None

        def __getattr__(self, attr):
            return getattr(self.finder, attr)

    sys.meta_path[:] = [_NoTorch(f) for f in sys.meta_path]
""")

#: entry points that need torch -> the feature their message names
ENTRY_POINTS = {
    "from seqpack.collate import InBatchPackingCollator": "seqpack.collate (the collators and PackedRowsDataset)",
    "import seqpack.loss": "seqpack.loss (the packed cross entropy)",
    "from seqpack.stream import StreamingPacker": "seqpack.stream.StreamingPacker",
    "from seqpack.parallel import BalancedBatchSampler": "seqpack.parallel.BalancedBatchSampler",
    "import seqpack.hf": "seqpack.hf (packed_forward and the HF model helpers)",
    "row.to_torch()": "PackedSequence.to_torch()",
    "seqpack.adapters.to_megatron(row)": "seqpack.adapters.megatron.to_megatron()",
}

#: runs in the child: the light API first (it must not import torch), then every entry point
CHILD = textwrap.dedent("""
    import json, sys
    import seqpack, seqpack.adapters, seqpack.stream, seqpack.parallel
    from seqpack.io import load_packed
    from seqpack.pipeline import pack_dataset

    res = pack_dataset(output=sys.argv[1], seq_length=1024)  # the embedded sample data and tokenizer
    ds = load_packed(sys.argv[1])
    row = ds[0]
    row.validate(capacity=1024)
    report = {"rows": len(ds), "num_rows": res.metadata.num_packs, "torch_imported": "torch" in sys.modules,
              "errors": {}}
    for stmt in json.loads(sys.argv[2]):
        try:
            exec(stmt)
            report["errors"][stmt] = None
        except BaseException as e:
            report["errors"][stmt] = [type(e).__name__, getattr(e, "name", None), str(e)]
    print(json.dumps(report))
""")


def _python(code: str, *args: str, path: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*(path or []), SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def blocked(tmp_path_factory):
    out = tmp_path_factory.mktemp("no_torch") / "packed"
    r = _python(BLOCK_TORCH + CHILD, str(out), json.dumps(list(ENTRY_POINTS)))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_packing_and_loading_work_without_torch_and_import_none(blocked):
    assert blocked["rows"] == blocked["num_rows"] and blocked["rows"] >= 1
    # recorded before the torch entry points ran: packing, loading and the light packages import no torch
    assert blocked["torch_imported"] is False


@pytest.mark.parametrize("stmt", list(ENTRY_POINTS))
def test_each_torch_entry_point_says_what_needs_torch_and_the_fix(blocked, stmt):
    kind, name, message = blocked["errors"][stmt]
    assert (kind, name) == ("ModuleNotFoundError", "torch")
    assert message == missing_torch_message(ENTRY_POINTS[stmt])
    assert message.endswith('Fix: pip install -e ".[torch]" (or pip install "seqpack[torch]")')


def test_the_message_names_the_extra_pyproject_defines():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(SRC).parent / "pyproject.toml").read_text())
    assert "torch" in pyproject["project"]["optional-dependencies"]
    assert '".[torch]"' in TORCH_FIX and '"seqpack[torch]"' in TORCH_FIX
    assert missing_torch_message("seqpack train") == f"seqpack train needs PyTorch, which is not installed. Fix: {TORCH_FIX}"


def test_the_sys_modules_sentinel_counts_as_missing_torch_too():
    # sys.modules["torch"] = None makes ``import torch.distributed`` fail on "torch.distributed", not "torch"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from seqpack.parallel import BalancedBatchSampler\n")
    r = _python(code)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == "ModuleNotFoundError: " + missing_torch_message("seqpack.parallel.BalancedBatchSampler")


@pytest.mark.parametrize("init, error", [
    # a dependency of torch is missing: the real name must stay visible
    ("import seqpack_test_missing_dependency\n",
     "ModuleNotFoundError: No module named 'seqpack_test_missing_dependency'"),
    # a broken build: torch found, its compiled part not
    ("import torch._C\n", "ModuleNotFoundError: No module named 'torch._C'"),
    # a shared library that does not load
    ("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n",
     "ImportError: libtorch_cpu.so: cannot open shared object file"),
])
def test_an_import_error_inside_an_installed_torch_is_not_rewritten(tmp_path, init, error):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(init)
    r = _python("import seqpack.loss\n", path=[str(tmp_path)])
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == error
    assert "needs PyTorch" not in r.stderr
