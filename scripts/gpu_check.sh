#!/usr/bin/env bash
# One-shot GPU check (H100/H200), every GPU row of BENCHMARKS.md in one call of <= 10 minutes;
# installs nothing from the network, needs no Hydra.
#   smoke     tiny model end to end (load, greedy decode vs transformers, two train steps)
#   layout    decode of the 0.5B shape at batch 1 and 256: scanned vs unrolled layers x the
#             reference decode attention vs the Pallas ragged kernel (#18 item 4)
#   graphs    the same decode rows under XLA's command buffers (CUDA graphs) forced on for every
#             op kind, and off (XLA_FLAGS recorded in each row)
#   train     train-step MFU, reference einsum attention vs cuDNN fused, 0.5B and 1.5B at 8 x 2048
#   decode    (not by default: the 10-minute budget) 0.5B and 1.5B at batch 1 / 64 / 256 vs
#             transformers generate and the HBM roofline, the rows BENCHMARKS.md has today
# Usage: bash scripts/gpu_check.sh [OUT_DIR] [PHASE...]   (default OUT_DIR benchmarks/gpu_<date>,
#   default phases smoke layout graphs train: ~9 minutes of limits); writes OUT_DIR/gpu_<phase>.json (rewritten after every row)
#   and OUT_DIR/gpu_log.txt. Render: python scripts/bench_gpu.py --render OUT_DIR/gpu_*.json
# A failed smoke with the machine's flax is retried with a flax wheel carried in .whl/ (pip
# download flax==<our pin>), installed to /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-benchmarks/gpu_$(date -u +%Y%m%d)}}"
shift || true
phases=("${@:-layout graphs train}")
phases=(${phases[*]})
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log="$out/gpu_log.txt"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import jax, flax, sys; print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
} 2>&1 | tee "$log"
if ! timeout 120 python3 scripts/bench_gpu.py --out "$out/gpu_smoke.json" --only smoke 2>&1 | tee -a "$log"; then
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
run_phase() {  # name timeout_s xla_flags bench_gpu.py args...
  local name=$1 limit=$2 flags=$3
  shift 3
  echo "== $name (<= ${limit}s) XLA_FLAGS=$flags" | tee -a "$log"
  XLA_FLAGS="$flags" timeout "$limit" python3 scripts/bench_gpu.py --out "$out/gpu_$name.json" \
    "$@" 2>&1 | grep -v "^$" | tee -a "$log"
}
small=(--only decode --models 0.5b --batches 1 256 --skip-hf --repeats 2)
graphs_on="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1"
for phase in "${phases[@]}"; do
  case $phase in
    layout) run_phase layout 130 "" "${small[@]}" --unroll both --decode-attention both ;;
    graphs)
      run_phase graphs_on 70 "$graphs_on" "${small[@]}" --unroll true
      run_phase graphs_off 70 "--xla_gpu_enable_command_buffer=" "${small[@]}" --unroll true ;;
    train) run_phase train 130 "" --only train --train-attention both --train-plan 0.5b:2048 1.5b:2048 ;;
    decode) run_phase decode 240 "" --only decode ;;
    *) echo "unknown phase $phase (layout graphs train decode)" | tee -a "$log"; exit 2 ;;
  esac
done
echo "wrote $out/gpu_*.json; render: python scripts/bench_gpu.py --render $out/gpu_*.json" | tee -a "$log"
