"""PackingConfig construction and loading: YAML, JSON, Python; aliases; schema errors; expectations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from seqpack.algorithms import DEFAULT_ALGORITHM, PackingAlgorithm
from seqpack.config import (
    ALGORITHM_VALUES,
    AttentionBackend,
    ConfigValidationError,
    PackingConfig,
    PackingMode,
    load_config,
    load_registry,
)

YAML = """\
# a packing config
packing: in_batch
seq_length: 8192
pad_seq_to_mult: 8          # Megatron-Bridge spelling of pad_to_multiple_of
micro_batch_size: 4
context_parallel_size: 2
flatten_micro_batch: true
calculate_per_token_loss: true
average_in_collective: false
algorithm: best_fit_decreasing
model_family: qwen3
tokenizer: Qwen/Qwen3-8B
"""


def test_load_yaml_json_and_python_agree(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text(YAML)
    a = PackingConfig.from_file(y)
    j = tmp_path / "c.json"
    j.write_text(json.dumps(a.to_dict()))
    b = load_config(j)
    c = PackingConfig(packing="in_batch", seq_length=8192, pad_to_multiple_of=8, micro_batch_size=4,
                      context_parallel_size=2, flatten_micro_batch=True, calculate_per_token_loss=True,
                      average_in_collective=False, algorithm=PackingAlgorithm.best_fit_decreasing,
                      model_family="qwen3", tokenizer="Qwen/Qwen3-8B")
    assert a == b == c
    assert a.packing is PackingMode.IN_BATCH
    assert a.pad_to_multiple_of == 8
    assert a.effective_pad_multiple == 8  # lcm(8, 2*2)
    assert a.validate() is a


def test_yaml_roundtrip():
    c = PackingConfig(packing="streaming", fp8=True, cuda_graphs=True, mtp_num_layers=None)
    again = PackingConfig.from_dict(__import__("yaml").safe_load(c.to_yaml()))
    assert again == c
    assert c.fp8 == "e4m3" and c.mtp_num_layers == 0


@pytest.mark.parametrize("alias,field,value", [
    ("pad_seq_to_mult", "pad_to_multiple_of", 16),
    ("packed_sequence_size", "seq_length", 2048),
    ("capacity", "seq_length", 1024),
    ("enable_cuda_graph", "cuda_graphs", True),
    ("packed_metadata", "packed_metadata_path", "/d/metadata.json"),
    ("packing_mode", "packing", PackingMode.NONE),
])
def test_aliases(alias, field, value):
    raw = value.value if isinstance(value, PackingMode) else value
    assert getattr(PackingConfig.from_dict({alias: raw}), field) == value


def test_unknown_key_did_you_mean(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("seq_len: 4096\nmicro_batch: 2\n")
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_file(p)
    vs = ei.value.violations
    assert [v.keys for v in vs] == [("seq_len",), ("micro_batch",)]
    assert "did you mean 'seq_length'?" == vs[0].fix
    assert "micro_batch_size" in vs[1].fix
    assert str(p) in str(ei.value)


def test_an_unknown_or_mistyped_key_does_not_hide_the_rule_violations():
    base = {"seq_length": 1000, "context_parallel_size": 2, "pad_to_multiple_of": 3}
    want = {v.rule for v in PackingConfig.from_dict(base).violations()}
    assert {"seq_length_divisible", "cp_loss_settings"} <= want
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict({**base, "bogus_key": 1})
    vs = ei.value.violations
    assert vs[0].keys == ("bogus_key",) and {v.rule for v in vs[1:]} == want
    # a rule about a key that failed the schema, or that a typo was meant to set, would judge a default
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict({"seq_lenght": 1000, "context_parallel_size": 2, "pad_to_multiple_of": 3})
    rules = [v.rule for v in ei.value.violations]
    assert rules[0] == "schema" and "seq_length_divisible" not in rules and "cp_loss_settings" in rules
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict({"seq_length": "abc", "context_parallel_size": 2, "pad_seq_to_mult": 3})
    rules = [v.rule for v in ei.value.violations]
    assert rules[0] == "schema" and "seq_length_divisible" not in rules and "cp_loss_settings" in rules


def test_bad_algorithm_lists_enum_values():
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict({"algorithm": "first_fit_decreassing"})
    v = ei.value.violations[0]
    assert v.keys == ("algorithm",)
    assert "did you mean 'first_fit_decreasing'" in v.problem


def test_streaming_accepts_every_packing_algorithm_and_nothing_else():
    # seqpack.stream runs any PackingAlgorithm on its buffer; anything else is a schema error.
    for a in PackingAlgorithm:
        c = PackingConfig(packing="streaming", algorithm=a, calculate_per_token_loss=True)
        assert c.algorithm == a.value and c.violations() == []
    with pytest.raises(ConfigValidationError):
        PackingConfig.from_dict({"packing": "streaming", "algorithm": "online_magic"})


def test_algorithm_values_match_enum_and_default():
    assert ALGORITHM_VALUES == tuple(a.value for a in PackingAlgorithm)
    assert PackingConfig().algorithm == DEFAULT_ALGORITHM.value


def test_attention_backends_enum_matches_registry():
    assert {b.value for b in AttentionBackend} == set(load_registry().attention_backends)


@pytest.mark.parametrize("data,key", [
    ({"seq_length": 0}, "seq_length"),
    ({"micro_batch_size": "two"}, "micro_batch_size"),
    ({"packing": "sometimes"}, "packing"),
    ({"context_parallel_size": -2}, "context_parallel_size"),
    ({"moe_aux_loss_coeff": -1.0}, "moe_aux_loss_coeff"),
])
def test_schema_errors_name_the_key(data, key):
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict(data)
    assert ei.value.violations[0].keys == (key,)
    assert ei.value.violations[0].rule == "schema"


@pytest.mark.parametrize("key", ["seq_length", "micro_batch_size", "context_parallel_size", "moe_aux_loss_coeff"])
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_no_number(key, value):
    """YAML ``seq_length: true`` is refused by name (pydantic's lax mode alone would read it as 1)."""
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict({key: value})
    v = ei.value.violations[0]
    what = "a number" if key == "moe_aux_loss_coeff" else "an integer"
    assert (v.keys, v.rule) == ((key,), "schema")
    assert v.problem == f"{key} is a boolean ({str(value).lower()}), not {what}"
    assert PackingConfig.from_dict({"pad_to_max_length": True}).pad_to_max_length is True


@pytest.mark.parametrize("text, problem, fix", [
    ('seq_length: "4096"', "seq_length is the text '4096' (quoted), not an integer",
     "remove the quotes: `seq_length: 4096`"),
    ("context_parallel_size: '2'", "context_parallel_size is the text '2' (quoted), not an integer",
     "remove the quotes: `context_parallel_size: 2`"),
    ('sequence_parallel: "true"', "sequence_parallel is the text 'true' (quoted), not true or false",
     "remove the quotes: `sequence_parallel: true`"),
    ('sequence_parallel: "yes"', "sequence_parallel is text ('yes'), not true or false",
     "set sequence_parallel to true or false, e.g. `sequence_parallel: false`"),
    ("pad_to_max_length: 1", "pad_to_max_length is an integer (1), not true or false",
     "set pad_to_max_length to true or false, e.g. `pad_to_max_length: false`"),
    ('moe_aux_loss_coeff: "0.01"', "moe_aux_loss_coeff is the text '0.01' (quoted), not a number",
     "remove the quotes: `moe_aux_loss_coeff: 0.01`"),
    ("seq_length: 4096.0", "seq_length is a decimal number (4096.0), not an integer",
     "set seq_length to an integer, e.g. `seq_length: 4096`"),
    ("seq_length: -8", "seq_length must be >= 1, got -8", "set seq_length to an integer >= 1, e.g. `seq_length: 4096`"),
    ("global_batch_size: 0", "global_batch_size must be >= 1, got 0",
     "set global_batch_size to an integer >= 1, e.g. `global_batch_size: 1`"),
    ("packing: offlin", "packing is 'offlin'; choose one of: offline, in_batch, streaming, none",
     "did you mean `packing: offline`?"),
    ("tokenizer: 5", "tokenizer is an integer (5), not text", "write the text in quotes: `tokenizer: '5'`"),
    ("train_on: last", "train_on must be one of assistant, all (or null), got 'last'",
     "set train_on to one of the names listed, e.g. `train_on: assistant`"),
    ("packed_sequence: 'false'", "packed_sequence must be true or false, got 'false'",
     "write `packed_sequence: true` or `packed_sequence: false`, without quotes"),
])
def test_a_refused_value_is_worded_for_the_file_with_the_value_to_write(tmp_path, text, problem, fix):
    """Numbers and on/off keys are strict (a quoted "4096" is text, as the metadata check reads it); each
    problem says what the value is, and the fix gives the line to write."""
    path = tmp_path / "c.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_file(path)
    (v,) = ei.value.violations
    assert (v.rule, v.problem, v.fix) == ("schema", problem, fix)


def test_an_unknown_algorithm_names_the_choices_once_without_pydantics_prefix():
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict({"algorithm": "ffd"})
    (v,) = ei.value.violations
    assert v.problem.startswith("unknown packing algorithm 'ffd'; choose one of: concatenative, ")
    assert "Value error" not in v.problem and "(got" not in v.problem
    assert v.fix == f"set algorithm to one of the names listed, e.g. `algorithm: {DEFAULT_ALGORITHM.value}`"
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict({"algorithm": "first_fit_shufle"})
    assert ei.value.violations[0].fix == "did you mean `algorithm: first_fit_shuffle`?"


def test_python_construction_and_assignment_are_type_checked():
    with pytest.raises(ValidationError):
        PackingConfig(seq_lenght=4096)
    c = PackingConfig()
    with pytest.raises(ValidationError):
        c.micro_batch_size = 0


def test_numpy_integers_are_integers_but_numpy_floats_and_booleans_are_not():
    """A config built from arrays (``np.int64`` lengths) is accepted as plain ints; the strict check still
    refuses a float or a boolean, numpy or not."""
    import numpy as np

    c = PackingConfig(seq_length=np.int64(8192), micro_batch_size=np.int32(2))
    assert (c.seq_length, c.micro_batch_size) == (8192, 2) and type(c.seq_length) is int
    for bad in (np.float64(8192), np.bool_(True), 8192.0, "8192"):
        with pytest.raises(ValidationError, match="valid integer"):
            PackingConfig(seq_length=bad)


@pytest.mark.parametrize("name, text, match", [
    ("c.toml", "x = 1", "unsupported config file type"),
    ("bad.yaml", "seq_length: [1,\n", r"not valid YAML at line 2, column 1: expected the node content, but found "
                                       r"'<stream end>' \(while parsing a flow node\)"),
    ("indent.yaml", "seq_length: 4096\n  x: 1\n", "not valid YAML at line 2, column 4: mapping values are not allowed here"),
    ("bad.json", '{"a": 1,\n "b": }', "not valid JSON at line 2, column 7: Expecting value"),
    ("list.yaml", "- 1\n- 2\n", "expected a mapping"),
])
def test_file_errors(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigValidationError, match=match):
        PackingConfig.from_file(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found: .*missing.yaml"):
        PackingConfig.from_file(tmp_path / "missing.yaml")
    with pytest.raises(IsADirectoryError, match=f"config {tmp_path} is a folder, not a file; pass a .yaml"):
        PackingConfig.from_file(tmp_path)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert PackingConfig.from_file(empty) == PackingConfig()


def test_packed_data_expectations_values_and_keys():
    from seqpack.io.reader import EXPECT_KEYS

    c = PackingConfig(seq_length=8192, pad_to_multiple_of=8, context_parallel_size=2, tokenizer="Qwen/Qwen3-8B",
                      algorithm="first_fit_shuffle")
    exp = c.packed_data_expectations()
    # only tensor-contract keys: algorithm / user multiple are notes, the tokenizer is compared by identity
    assert exp == {"capacity": 8192, "effective_pad_multiple": 8, "context_parallel_size": 2}
    assert set(exp) <= set(EXPECT_KEYS)
    assert PackingConfig(train_on="all").packed_data_expectations()["train_on"] == "all"
    assert set(PackingConfig(train_on="all").packed_data_expectations()) <= set(EXPECT_KEYS)


def _write_cp1_dataset(out):
    from seqpack.sample import Sample
    from seqpack.io import write_packed
    from seqpack.io.metadata import PackedMetadata
    from seqpack.packed import build_packed_sequence

    def sample(n, i):
        ids = np.arange(1, n + 1, dtype=np.int32)
        labels = np.concatenate([ids[1:], [-100]]).astype(np.int32)
        return Sample(ids, labels, sample_id=f"s{i}")

    row = build_packed_sequence([sample(5, 0), sample(3, 1)], pad_to_multiple_of=1, pad_token_id=0, seq_length=16)
    meta = PackedMetadata(seq_length=16, pad_to_multiple_of=1, context_parallel_size=1, effective_pad_multiple=1,
                          algorithm="first_fit_shuffle")
    write_packed([row], out, meta)
    return out


def test_B23_stale_packed_data_rejected_through_expectations(tmp_path):
    """Data packed for CP=1 must not load silently for a CP=2 run (io owns the comparison)."""
    from seqpack.io import load_packed
    from seqpack.io.metadata import StalePackedDatasetError

    out = _write_cp1_dataset(tmp_path / "packed")
    cp1 = PackingConfig(seq_length=16, algorithm="first_fit_shuffle")
    ds = load_packed(out, expect=cp1.packed_data_expectations())
    assert len(ds) == 1

    cp2 = PackingConfig(seq_length=16, algorithm="first_fit_shuffle", context_parallel_size=2,
                        calculate_per_token_loss=True, average_in_collective=False)
    assert cp2.violations() == []
    with pytest.raises(StalePackedDatasetError) as ei:
        load_packed(out, expect=cp2.packed_data_expectations())
    assert "context_parallel_size" in str(ei.value) and "effective_pad_multiple" in str(ei.value)


def test_B23_packed_data_violations(tmp_path):
    out = _write_cp1_dataset(tmp_path / "packed")
    common = dict(seq_length=16, algorithm="first_fit_shuffle", packed_dataset_path=str(out))
    assert PackingConfig(**common).packed_data_violations() == []
    stale = PackingConfig(**common, context_parallel_size=2).packed_data_violations()
    assert [v.rule for v in stale] == ["stale_packed_data"]
    assert stale[0].case == "B23"
    assert set(stale[0].keys) == {"packed_dataset_path", "context_parallel_size", "effective_pad_multiple"}
    assert "stored 1 vs config 2" in stale[0].problem
    other = PackingConfig(**{**common, "seq_length": 32}).packed_data_violations()
    assert other[0].keys == ("packed_dataset_path", "capacity")
    missing = PackingConfig(**{**common, "packed_dataset_path": str(tmp_path / "nope")}).packed_data_violations()
    assert [v.rule for v in missing] == ["packed_data_unreadable"] and "does not exist" in missing[0].problem
    assert PackingConfig().packed_data_violations() == []


@pytest.mark.parametrize("flags,mode", [({"packed_sequence": True}, PackingMode.OFFLINE),
                                        ({"pack_sequences_in_batch": True, "micro_batch_size": 2}, PackingMode.IN_BATCH),
                                        ({"packed_sequence": False}, PackingMode.NONE),
                                        ({"packed_sequence": True, "packing": "offline"}, PackingMode.OFFLINE)])
def test_megatron_bridge_packing_flags(flags, mode):
    assert PackingConfig.from_dict(flags).packing is mode


@pytest.mark.parametrize("flags,text", [
    ({"packed_sequence": True, "pack_sequences_in_batch": True}, "mutually exclusive"),
    ({"packed_sequence": True, "packing": "in_batch"}, "packing 'in_batch' contradicts"),
])
def test_offline_and_in_batch_flags_mutually_exclusive(flags, text):
    with pytest.raises(ConfigValidationError) as ei:
        PackingConfig.from_dict(flags)
    v = ei.value.violations[0]
    assert v.rule == "packing_modes_exclusive"
    assert {"packed_sequence", "pack_sequences_in_batch"} <= set(v.keys)
    assert text in v.problem


def test_a_key_given_twice_is_a_parse_violation(tmp_path):
    y = tmp_path / "dup.yaml"
    y.write_text("tokenizer: qwen3\npacking: offline\nseq_length: 2048\nseq_length: 8192\n")
    with pytest.raises(ConfigValidationError) as e:
        PackingConfig.from_file(y)
    [v] = e.value.violations
    assert (v.rule, v.keys, v.problem, v.fix) == (
        "parse", ("seq_length",), "key 'seq_length' is given twice (lines 3 and 4); the second value would silently win",
        "keep one")
    j = tmp_path / "dup.json"
    j.write_text('{"seq_length": 4096, "seq_length": 1024}')
    with pytest.raises(ConfigValidationError) as e:
        PackingConfig.from_file(j)
    [v] = e.value.violations
    assert (v.rule, v.problem, v.fix) == (
        "parse", "key 'seq_length' is given twice; the second value would silently win", "keep one")
    # a YAML merge key overrides by design and stays allowed
    m = tmp_path / "merge.yaml"
    m.write_text("base: &b {seq_length: 2048}\n")
    with pytest.raises(ConfigValidationError) as e:  # unknown key 'base', not a duplicate
        PackingConfig.from_file(m)
    assert "given twice" not in str(e.value)


def test_cli_validate_refuses_a_key_given_twice(tmp_path):
    import subprocess
    import sys

    y = tmp_path / "dup.yaml"
    y.write_text("tokenizer: qwen3\npacking: offline\nseq_length: 2048\nseq_length: 8192\n")
    r = subprocess.run([sys.executable, "-m", "seqpack", "validate", str(y)], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "key 'seq_length' is given twice (lines 3 and 4)" in r.stdout + r.stderr
