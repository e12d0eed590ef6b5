#!/usr/bin/env bash
# Padded vs packed training throughput of a 0.61B-parameter Qwen3-like model (613,208,064 parameters, counted
# from bench_gpu.py's config; see its docstring) on one NVIDIA GPU (H200 target).
#
#   bash src/seqpack_bench/gpu/run.sh             # GPU: 100 steps padded vs packed, bf16 autocast (stopped after 470 s; not yet timed on a GPU)
#   bash src/seqpack_bench/gpu/run.sh --dry-run   # CPU: tiny config, 3 steps, fp32 sdpa (what CI runs)
#   extra flags go to bench_gpu.py (python -m seqpack_bench.gpu.bench_gpu: --steps N, --attn sdpa|flash_attention_2, --out DIR, --pure-bf16);
#   --attn applies to the GPU run only: the dry run always uses sdpa (bench_gpu.py prints a note and
#   records the requested value as attn_requested in gpu.json)
#
# The dry run checks the script end to end and the loss goal (PASS/MISS); its speed line reads
# "n/a on CPU dry run" (the 2x goal is for the GPU run) and gpu.json has goals.speedup_ge_2x = null.
# --out (default $OUT, else gpu_results) is created and checked for writing before anything else runs.
# Written there (each printed as "wrote <path>"): gpu.json, train.json, train_loss.png, train_throughput.png.
#
# Wheels: if a folder .whl/ sits beside this script, every wheel in it is installed first with
# `pip install --no-index --find-links .whl` (no network needed; e.g. flash-attn, a matching torch).
# flash-attn varlen is used when `import flash_attn` works, else sdpa with seqpack's packed path.
#
# This workplace's H200 image (/work/.library/device/KINDS.md, 2026-11) has python3 3.12 with torch 2.11,
# transformers 5.17, tokenizers, numba, pyarrow, typer, rich, matplotlib: nothing needs carrying for this
# benchmark (synthetic tokens, no tokenizer). It has no pydantic, datasets, torchdata or flash-attn;
# tests/seqpack_bench/train/test_train_gpu.py runs the dry run with those blocked, and the HF equivalence tests pass under
# transformers 5.17 (checked on CPU, 2026-11-29). No run on a GPU has happened yet.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$(cd "$HERE/../.." && pwd)"   # the folder holding seqpack_bench (src/ of a checkout, or site-packages)
PY="${PYTHON:-python3}"
DRY=0
ARGS=()
OUT_DIR="${OUT:-gpu_results}"
PREV=""
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --out=*) OUT_DIR="${a#--out=}"; ARGS+=("$a") ;;
    *) [ "$PREV" = "--out" ] && OUT_DIR="$a"; ARGS+=("$a") ;;
  esac
  PREV="$a"
done

# fail before any work (wheel install, model build) when the output folder cannot be written
if ! mkdir -p -- "$OUT_DIR" 2>/dev/null || ! PROBE="$(mktemp -p "$OUT_DIR" .run-sh-write-check-XXXXXX 2>/dev/null)"; then
  echo "[run.sh] error: --out: cannot create or write the folder '$OUT_DIR'; pass a writable folder, e.g. --out gpu_results" >&2
  exit 2
fi
rm -f -- "$PROBE"

if [ "$DRY" = 0 ]; then
  if [ -d "$HERE/.whl" ] && ls "$HERE"/.whl/*.whl >/dev/null 2>&1; then
    echo "[run.sh] installing wheels from $HERE/.whl"
    "$PY" -m pip install -q --no-index --find-links "$HERE/.whl" "$HERE"/.whl/*.whl \
      || echo "[run.sh] warning: some wheels did not install; continuing with what is there"
  fi
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" - <<'PYEOF' || { echo "[run.sh] no CUDA device visible to torch; use --dry-run on CPU"; exit 3; }
import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)
PYEOF
  LIMIT=470   # whole run inside 8 minutes, wheel install included
else
  LIMIT=300
  ARGS=(--dry-run "${ARGS[@]+"${ARGS[@]}"}")
fi

export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
exec timeout "$LIMIT" "$PY" -m seqpack_bench.gpu.bench_gpu "${ARGS[@]+"${ARGS[@]}"}"
