#!/usr/bin/env bash
# One-shot GPU check (H100/H200): installs nothing from the network, needs no Hydra.
# Decode throughput of 0.5B- and 1.5B-shaped random Qwen2 models at batch 1/64/256 vs the HBM
# roofline and vs transformers generate on the same GPU and weights; train-step MFU.
# Usage: bash scripts/gpu_check.sh [OUT_DIR] [bench_gpu.py args...]
#   writes OUT_DIR/gpu_results.json (rewritten after every row) and OUT_DIR/gpu_log.txt; ~5 min.
# A tiny end-to-end smoke runs first with the machine's own flax; if it fails and a flax wheel
# was carried in .whl/ (pip download flax==<our pin>), that wheel is installed to /tmp/site and
# the smoke is retried with it.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log="$out/gpu_log.txt"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import jax, flax, sys; print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
} 2>&1 | tee "$log"
if ! timeout 150 python3 scripts/bench_gpu.py --out "$out/gpu_smoke.json" --only smoke 2>&1 | tee -a "$log"; then
  if ls .whl/flax-*.whl >/dev/null 2>&1; then
    echo "smoke failed with the machine's flax; retrying with the carried wheel" | tee -a "$log"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/flax-*.whl 2>&1 | tee -a "$log"
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
    timeout 150 python3 scripts/bench_gpu.py --out "$out/gpu_smoke.json" --only smoke 2>&1 \
      | tee -a "$log" || { echo "smoke failed again; stopping" | tee -a "$log"; exit 3; }
  else
    echo "smoke failed; stopping" | tee -a "$log"; exit 3
  fi
fi
timeout "${GPU_CHECK_TIMEOUT:-420}" python3 scripts/bench_gpu.py --out "$out/gpu_results.json" \
  "${@:2}" 2>&1 | grep -v "^$" | tee -a "$log"
