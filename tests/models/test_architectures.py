"""Every causal LM transformers ships: packed training equals each sample alone, or seqpack refuses it.

The matrix (``_arch``: discovery, tiny configs, the four packed paths) runs once per session; each
model type is one test: ``exact`` passes, ``refused`` passes when the refusal names the model type and
the first packed call refuses too, ``skipped`` skips with its recorded reason, ``mismatch`` fails with
the max logit / gradient differences of the failing paths. The README's "Supported architectures"
table must equal :func:`support_table.render` of the same outcomes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _arch  # noqa: E402
import support_table  # noqa: E402

TYPES = _arch.causal_lm_types()

OPEN = _arch.OPEN


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = _arch.run_matrix(tmp_path_factory.mktemp("matrix"))
    finally:
        torch.set_num_threads(threads)
    return {o.model_type: o for o in res}


def test_discovery_is_the_installed_mapping():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert [t for t, _ in TYPES] == sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert len(TYPES) > 100


def test_tiny_config_keeps_every_layer_kind_and_shrinks_windows():
    cfg = _arch.tiny_config("gemma3_text")
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert cfg.sliding_window == _arch.WINDOW < 10
    assert cfg.hidden_size == _arch.HIDDEN and cfg.vocab_size == _arch.VOCAB


@pytest.mark.parametrize("model_type", [t for t, _ in TYPES])
def test_architecture(outcomes, model_type):
    o = outcomes[model_type]
    if o.status == "skipped":
        assert o.reason
        pytest.skip(o.reason)
    assert not o.kinds_lost, f"the tiny config lost layer kinds of the default: {o.kinds_lost}"
    if model_type in OPEN:
        assert o.status == "mismatch", f"{model_type} is {o.status} now: remove it from OPEN"
        pytest.xfail(f"{OPEN[model_type]}: {o.reason}")
    if o.status == "mismatch":
        pytest.fail(f"{model_type} ({o.architecture}): {o.reason}", pytrace=False)
    if o.status == "refused":
        named = re.search(r"model_type '([^']+)'", o.reason)  # a composite config names its text model's type
        assert named and named.group(1).startswith(model_type) and "Instead" in o.reason, o.reason
        first = o.paths.get("forward")
        assert first is None or first["ok"], first
        return
    assert o.status == "exact"
    assert set(o.paths) == set(_arch.PATHS)
    assert all(r["ok"] for r in o.paths.values()), o.paths


def test_readme_table_is_the_matrix_output(outcomes):
    text = support_table.README.read_text()
    want = support_table.render(list(outcomes.values()))
    assert support_table.readme_table(text) == want, (
        "README.md's support table is not the matrix's output; run `python tests/models/support_table.py --write`")
