#!/usr/bin/env bash
# Padded vs packed training throughput of a ~0.5B Qwen3-like model on one NVIDIA GPU (H200 target).
#
#   bash benchmarks/gpu/run.sh             # GPU: 100 steps padded vs packed, bf16 autocast, < 8 min
#   bash benchmarks/gpu/run.sh --dry-run   # CPU: tiny config, 3 steps, fp32 sdpa (what CI runs)
#   extra flags go to bench_gpu.py (--steps N, --attn sdpa|flash_attention_2, --out DIR, --pure-bf16)
#
# Wheels: if a folder .whl/ sits beside this script, every wheel in it is installed first with
# `pip install --no-index --find-links .whl` (no network needed; e.g. flash-attn, a matching torch).
# flash-attn varlen is used when `import flash_attn` works, else sdpa with seqpack's packed path.
#
# This workplace's H200 image (/work/.library/device/KINDS.md, 2026-11) has python3 3.12 with torch 2.11,
# transformers 5.17, tokenizers, numba, pyarrow, typer, rich, matplotlib: nothing needs carrying for this
# benchmark (synthetic tokens, no tokenizer). It has no pydantic, datasets, torchdata or flash-attn;
# tests/test_train.py runs the dry run with those blocked, and the HF equivalence tests pass under
# transformers 5.17 (checked on CPU, 2026-11-29). No run on a GPU has happened yet.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
DRY=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    *) ARGS+=("$a") ;;
  esac
done

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

export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
exec timeout "$LIMIT" "$PY" "$HERE/bench_gpu.py" "${ARGS[@]+"${ARGS[@]}"}"
