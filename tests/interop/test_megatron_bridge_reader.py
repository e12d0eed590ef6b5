"""seqpack's Megatron-Bridge export read by Megatron-Bridge 0.6 itself (``GPTSFTPackedParquetDataset`` and
its ``collate_fn``), with a real tokenizer whose pad (``<|endoftext|>``) and EOS (``<|im_end|>``) differ.

Bridge >= 0.6 needs Python 3.12: ``.ci/bridge-env.sh`` builds that venv and ``_bridge_reader.py`` runs in it
(one subprocess for all cases). Bridge's collate appends a zero-length logical segment for the row tail
(the tail is Bridge's own padding to ``max_seq_length``) and keeps only the alignment padding of the last
segment; otherwise its ``cu_seqlens`` / ``cu_seqlens_padded`` must equal seqpack's, its loss mask must be
seqpack's ``labels != -100`` and its labels seqpack's where trained.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from seqpack import load_packed, pack_dataset
from seqpack.data import prepare
from seqpack.interop import export_megatron_bridge
from seqpack.packed import build_packed_sequence
from seqpack.padding import round_up
from seqpack.sample import IGNORE_INDEX, Sample

HERE = Path(__file__).resolve().parent
DEMO = HERE.parents[1] / "src" / "seqpack" / "resources" / "sample_chat.jsonl"
BRIDGE_PYTHON = Path(os.environ.get("SEQPACK_BRIDGE_PYTHON", "/work/venvs/bridge/bin/python"))
SEQ = 1024


def _packs(samples, m):
    """Consecutive samples into rows of SEQ tokens (segments padded to m)."""
    rows, cur = [], []
    for s in samples:
        if cur and sum(round_up(x.length, m) for x in cur) + round_up(s.length, m) > SEQ:
            rows.append(cur)
            cur = []
        cur.append(s)
    rows.append(cur)
    return [build_packed_sequence(r, pad_to_multiple_of=m, pad_token_id=PAD, seq_length=SEQ, pad_to_max_length=True)
            for r in rows]


PAD = 151643  # Qwen3's pad token <|endoftext|>; its EOS is <|im_end|> (151645)


def _assert_bridge_reads(pack, brow, m, real_lens=None):
    """Bridge's collated row equals the seqpack pack (module docstring); real_lens: the lengths declared."""
    cu = np.asarray(pack.cu_seqlens, dtype=np.int64)
    cup = np.asarray(pack.cu_seqlens_padded, dtype=np.int64)
    if real_lens is not None:
        cu = np.concatenate([[0], np.cumsum(real_lens)])
    n, T = len(cup) - 1, int(cup[-1])  # Bridge pads every row to max_seq_length (SEQ >= T)
    bcu = np.asarray(brow["cu_seqlens_q"])
    assert len(brow["tokens"]) == SEQ
    assert bcu[: n + 1].tolist() == cu.tolist()
    if m > 1:
        bcup = np.asarray(brow["cu_seqlens_q_padded"])
        assert bcup[:n].tolist() == cup[:n].tolist()
        assert bcup[n] == cup[n - 1] + round_up(int(cu[n] - cu[n - 1]), m) and bcup[-1] == SEQ
        assert (bcu[n + 1 :] == cu[n]).all()  # Bridge's tail segment holds no real token
    else:
        assert "cu_seqlens_q_padded" not in brow and (bcu[n + 1 :] == SEQ).all()
    lab = np.asarray(pack.labels)
    lm = np.asarray(brow["loss_mask"]).astype(bool)
    assert lm[:T].tolist() == (lab != IGNORE_INDEX).tolist() and not lm[T:].any()
    assert np.asarray(brow["labels"])[:T][lm[:T]].tolist() == lab[lm[:T]].tolist()
    real = ~np.asarray(pack.padding_mask)
    if real_lens is None:
        assert np.asarray(brow["tokens"])[:T][real].tolist() == np.asarray(pack.input_ids)[real].tolist()
        assert np.asarray(brow["position_ids"])[:T][real].tolist() == np.asarray(pack.position_ids)[real].tolist()


@pytest.fixture(scope="module")
def bridge_python():
    if not BRIDGE_PYTHON.is_file():
        pytest.skip(f"no Megatron-Bridge 0.6 venv at {BRIDGE_PYTHON} (Bridge needs Python 3.12): run .ci/bridge-env.sh")
    return BRIDGE_PYTHON


def test_bridge_reader_recovers_seqpack_boundaries(bridge_python, qwen3_tokenizer, tmp_path):
    tok_dir = tmp_path / "tok"
    qwen3_tokenizer.save_pretrained(tok_dir)
    eos = qwen3_tokenizer.eos_token_id
    assert qwen3_tokenizer.pad_token_id == PAD != eos
    jobs, expect = [], []

    def job(path, m, **kw):
        jobs.append({"path": str(path), "tokenizer": str(tok_dir), "seq_length": SEQ, "pad_seq_to_mult": m, **kw})

    # A: real chats (end with "\n"), multiple 8 (CP=4): a packed dataset, defaults (pad, EOS, multiple) from
    # its metadata.json; Bridge's static-shape mode also reads the packing metadata seqpack wrote
    pack_dataset([DEMO], tmp_path / "packed", tokenizer="qwen3", seq_length=SEQ, pad_to_multiple_of=8)
    ex = export_megatron_bridge(tmp_path / "packed", tmp_path / "bridge")
    ds = load_packed(tmp_path / "packed")
    rows_a = [ds[i] for i in range(len(ds))]
    job(ex.files[0].parent, 8)
    expect.append((8, rows_a, None))
    job(ex.files[0].parent, 8, pad_cu_seqlens=True, metadata=str(ex.metadata_path))
    expect.append((8, rows_a, None))
    # the same chats with multiple 1
    samples, _ = prepare(str(DEMO), qwen3_tokenizer, seq_length=SEQ)
    rows_1 = _packs(samples, 1)
    ex = export_megatron_bridge(rows_1, tmp_path / "bridge1", pack_size=SEQ, pad_to_multiple_of=1, pad_token_id=PAD,
                                eos_token_id=eos)
    job(ex.files[0].parent, 1)
    expect.append((1, rows_1, None))
    # B: chats that end with EOS as an input (as Llama 3's end with <|eot_id|>)
    ending = [Sample(s.input_ids[:-1], s.labels[:-1], s.sample_id) for s in samples]
    assert all(int(s.input_ids[-1]) == eos for s in ending)
    packs8 = _packs(ending, 8)
    with pytest.raises(ValueError, match=r"ends with 1 EOS input token\(s\) \(151645\).*would see"):
        export_megatron_bridge(packs8, tmp_path / "refused", pack_size=SEQ, pad_to_multiple_of=8, pad_token_id=PAD,
                               eos_token_id=eos)
    ex = export_megatron_bridge(packs8, tmp_path / "eos8", pack_size=SEQ, pad_to_multiple_of=8, pad_token_id=PAD,
                                eos_token_id=eos, trailing_eos="as_final_target")
    job(ex.files[0].parent, 8)
    expect.append((8, packs8, "minus_one"))
    packs1 = _packs(ending, 1)  # no alignment padding: Bridge takes lengths from seq_start_id, any tokens
    ex = export_megatron_bridge(packs1, tmp_path / "eos1", pack_size=SEQ, pad_to_multiple_of=1, pad_token_id=PAD,
                                eos_token_id=eos)
    job(ex.files[0].parent, 1)
    expect.append((1, packs1, None))
    # C: padding written as the pad token (not Bridge's EOS): Bridge's logical lengths come out wrong
    export_megatron_bridge(rows_a, tmp_path / "padded_with_pad", pack_size=SEQ, pad_to_multiple_of=8, pad_token_id=PAD,
                           eos_token_id=PAD)
    job(tmp_path / "padded_with_pad", 8)

    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([str(bridge_python), str(HERE / "_bridge_reader.py"), str(tmp_path / "jobs.json"),
                           str(tmp_path / "out.json")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out[0]["versions"]["megatron-bridge"].startswith("0.6") and out[0]["eos_id"] == eos
    for (m, packs, mode), res in zip(expect, out):
        assert res["class"] == "GPTSFTPackedParquetDataset" and len(res["rows"]) == len(packs)
        for pack, brow in zip(packs, res["rows"]):
            lens = None if mode is None else np.diff(np.asarray(pack.cu_seqlens)) - 1
            _assert_bridge_reads(pack, brow, m, real_lens=lens)
    wrong = out[-1]["rows"]
    for pack, brow in zip(rows_a, wrong):
        n = len(pack.cu_seqlens) - 1
        assert brow["cu_seqlens_q"][: n + 1] != np.asarray(pack.cu_seqlens).tolist()
