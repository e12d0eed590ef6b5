"""Run Megatron-Bridge's own packed-Parquet dataset (reader + collate); print what they give, as JSON.

Executed by the Python 3.12 interpreter of ``.ci/bridge-env.sh``'s venv (Bridge >= 0.6 needs 3.12), in a
subprocess of ``test_megatron_bridge_reader.py``; it does not import seqpack. Input (argv[1]): a JSON list of
jobs ``{"path", "tokenizer", "seq_length", "pad_seq_to_mult", "pad_cu_seqlens", "metadata"}``. Output
(the file argv[2]): one JSON list, per job the versions used and, per packed row, the collated batch of one row.

Bridge's package ``__init__`` files (``megatron.bridge``, ``megatron.bridge.data``) import its whole model
stack, which needs Transformer Engine (CUDA-only); they are registered as plain packages over the installed
directories instead of being executed, so every module the reader imports is Bridge's own file.
"""

import importlib.metadata
import importlib.util
import json
import sys
import types
from pathlib import Path


def _bare_packages() -> None:
    root = Path(importlib.util.find_spec("megatron").submodule_search_locations[0]) / "bridge"
    for name, path in (("megatron.bridge", root), ("megatron.bridge.data", root / "data")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        sys.modules[name] = mod


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    _bare_packages()
    import torch
    from megatron.bridge.data.packing.parquet import GPTSFTPackedParquetDataset
    from megatron.core.tokenizers import MegatronTokenizer

    out = []
    for job in jobs:
        tok = MegatronTokenizer.from_pretrained(tokenizer_path=job["tokenizer"], metadata_path={"library": "huggingface"})
        # the arguments of Bridge's builder (data/builders/gpt_sft.py, build_gpt_sft_split) for a packed
        # Parquet path, its defaults kept; that module itself imports the model stack (TE), so it is not run
        pad_cu = bool(job.get("pad_cu_seqlens", False))
        ds = GPTSFTPackedParquetDataset(
            file_path=job["path"], tokenizer=tok, max_seq_length=job["seq_length"], memmap_workers=1,
            hf_dataset=False, global_sample_mapping=False, add_bos=False, add_eos=True, add_sep=False,
            seed=1234, label_key="output", answer_only_loss=True, truncation_field="input",
            pad_to_max_length=True, index_mapping_dir=None, prompt_template="{input} {output}",
            truncation_method="right", get_attention_mask_from_fusion=True, prompt_completion_config=None,
            is_test=False, pack_metadata_file_path=job.get("metadata") if pad_cu else None,
            pad_cu_seqlens=pad_cu, pad_seq_to_mult=job["pad_seq_to_mult"],
        )
        rows = []
        for i in range(len(ds)):
            b = ds.collate_fn([ds[i]])
            rows.append({k: (v[0].tolist() if isinstance(v, torch.Tensor) else v) for k, v in b.items()
                         if k != "attention_mask"})
        out.append({
            "class": type(ds).__name__, "eos_id": int(tok.eos_id), "rows": rows,
            "versions": {d: importlib.metadata.version(d) for d in ("megatron-bridge", "megatron-core", "torch")},
        })
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
