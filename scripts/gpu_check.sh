#!/usr/bin/env bash
# One-shot GPU check (H100/H200): installs nothing, needs no network, no Hydra.
# Decode throughput of 0.5B- and 1.5B-shaped random Qwen2 models at batch 1/64/256 vs the HBM
# roofline and vs transformers generate on the same GPU and weights; train-step MFU.
# Usage: bash scripts/gpu_check.sh [OUT_DIR]     (writes OUT_DIR/gpu_results.json; ~5-8 min)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
timeout 480 python3 scripts/bench_gpu.py --out "$out/gpu_results.json" "${@:2}"
