#!/usr/bin/env bash
# Python 3.12 venv with Megatron-Bridge 0.6's own packed Parquet reader + collate and megatron-core 0.19
# (megatron-bridge >= 0.6 requires Python >= 3.12; the main venv is 3.11). Used, in a subprocess, by
# tests/interop/test_megatron_bridge_reader.py. Bridge itself and megatron-core are installed --no-deps
# (their own pins include CUDA-only packages: Transformer Engine, mamba-ssm, flashinfer); only the
# packages their reader's import chain needs come with them. torch is PyPI's default (CUDA) build: the
# tests run it on CPU. Idempotent: a venv whose stamp matches is kept.
set -euo pipefail
VENV="${SEQPACK_BRIDGE_VENV:-/work/venvs/bridge}"
PY="${SEQPACK_PYTHON312:-}"
for cand in /root/.pyenv/versions/3.12.1/bin/python3.12 "$(command -v python3.12 || true)"; do
    if [ -z "$PY" ] && [ -n "$cand" ] && "$cand" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null; then
        PY="$cand"
    fi
done
DEPS=(torch==2.13.0 numpy pyarrow packaging transformers==5.12.1 datasets einops omegaconf rich regex tqdm pyyaml six)
NODEPS=(megatron-core==0.19.2 megatron-bridge==0.6.2)
WANT="${DEPS[*]} | ${NODEPS[*]}"
STAMP="$VENV/.seqpack-bridge-env"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c "import torch, pyarrow" 2>/dev/null; then
    echo "bridge env: $VENV is up to date"
    exit 0
fi
if [ -z "$PY" ]; then
    echo "bridge env: no Python 3.12 interpreter (set SEQPACK_PYTHON312)" >&2
    exit 1
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "${DEPS[@]}"
"$VENV/bin/python" -m pip install -q --no-deps "${NODEPS[@]}"
echo "$WANT" > "$STAMP"
echo "bridge env: $VENV ready ($(du -sh "$VENV" | cut -f1))"
