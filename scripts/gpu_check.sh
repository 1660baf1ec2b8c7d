#!/usr/bin/env bash
# Runs the GPU tests and the kernel benchmark in one call on a CUDA machine.
#   bash scripts/gpu_check.sh                 # everything
#   SKIP_BENCH=1 bash scripts/gpu_check.sh    # tests only
#   BENCH_ARGS="--baseline-tree /tmp/old/kernels" bash scripts/gpu_check.sh   # extra benchmark options
#   GPU_TEST_WORKERS=12 ...                   # test processes when pytest-xdist is installed (default: GiB / 20, at most 8)
#   TF_WHEELS=.whl/tf525 ...                  # also the model-facing GPU tests with the transformers (and its
#                                             # dependencies) of these wheels put first on the path
#   GPU_TEST_PART=1/2 ...                     # the tests of every other file only (2/2: the rest), for
#                                             # machines that hold a call for less than the whole suite
#   SKIP_TESTS=1 BENCH_SET=targets ...        # only the rows behind the README's generate() targets (graph
#                                             # step at batch 1 and 256, speculative oracle at batch 1)
# Logs and benchmark tables land in ${OUT:-out/gpu_check}/ (git-ignored).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-out/gpu_check}"
PART="${GPU_TEST_PART:-1/1}"
if ! [[ "$PART" =~ ^([1-9][0-9]*)/([1-9][0-9]*)$ ]] || (( BASH_REMATCH[1] > BASH_REMATCH[2] )); then
  echo "gpu_check.sh: GPU_TEST_PART must be i/n with 1 <= i <= n; got '$PART'" >&2
  exit 2
fi
PART_I=${BASH_REMATCH[1]} PART_N=${BASH_REMATCH[2]}
BENCH_SET="${BENCH_SET:-all}"
if [[ "$BENCH_SET" != all && "$BENCH_SET" != targets ]]; then
  echo "gpu_check.sh: BENCH_SET must be all or targets; got '$BENCH_SET'" >&2
  exit 2
fi
# the files of this part: every n-th of the sorted list, from the i-th
part_files() { sort | awk -v i="$PART_I" -v n="$PART_N" '(NR - i) % n == 0'; }
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT_DIR/install.log" 2>&1 || { cat "$OUT_DIR/install.log"; exit 1; }
# benchmark-only extras carried as wheels (e.g. flash-linear-attention's fla-core + einops), if any
if compgen -G ".whl/*.whl" >/dev/null; then python3 -m pip install -q --no-deps .whl/*.whl >>"$OUT_DIR/install.log" 2>&1 || true; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT_DIR/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT_DIR/gpu.txt"
rc=0
# pytest -v into LOG; the console shows each failure as it happens and the summary, so that a run stopped by a
# time limit still names what failed
run_pytest() {
  local log=$1; shift
  python3 -m pytest -v "$@" 2>&1 | tee "$log" | grep --line-buffered -E "FAILED|ERROR|^=+ .*(passed|failed|error|skipped)"
}
# several test processes on the one GPU when pytest-xdist is there (compiles dominate); one per 20 GiB of
# GPU memory, at most 8 (the real-size tests take up to ~20 GiB each: 8 of them overfilled an 80 GiB card)
WORKERS=""
if python3 -c "import xdist" >/dev/null 2>&1; then
  AUTO=$(python3 -c "import torch; print(max(1, min(8, torch.cuda.get_device_properties(0).total_memory // (20 * 2**30))))")
  WORKERS="-n ${GPU_TEST_WORKERS:-$AUTO}"
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  GPU_FILES=$(grep -rl --include='test_*.py' 'mark\.gpu' tests | part_files)
  echo "GPU test files, part $PART: $(echo $GPU_FILES | wc -w)" | tee -a "$OUT_DIR/gpu.txt"
  run_pytest "$OUT_DIR/gpu_tests.log" -m gpu $WORKERS ${PYTEST_ARGS:-} $GPU_FILES || rc=1
  # the unmarked tests that take the GPU when there is one (their files pick the device by CUDA's presence):
  # CI runs them under the interpreter, whose rounding is not the GPU's
  ADAPTIVE=$(grep -l 'is_available() else "cpu"' tests/*.py tests/*/*.py | part_files)
  if [ -n "$ADAPTIVE" ]; then
    run_pytest "$OUT_DIR/gpu_adaptive_tests.log" -m "not gpu" $WORKERS ${PYTEST_ARGS:-} $ADAPTIVE || rc=1
  fi
  # another transformers (e.g. the newest, where the machine has an older one): the model-facing GPU tests again
  if [ -n "${TF_WHEELS:-}" ]; then
    TF_DIR="$OUT_DIR/transformers-other"
    python3 -m pip install -q --no-deps --target "$TF_DIR" "$TF_WHEELS"/*.whl >>"$OUT_DIR/install.log" 2>&1 || rc=1
    PYTHONPATH="$TF_DIR" python3 -c "import transformers; print('transformers', transformers.__version__)" \
      | tee -a "$OUT_DIR/gpu.txt"
    PYTHONPATH="$TF_DIR" run_pytest "$OUT_DIR/gpu_tests_other_transformers.log" $WORKERS -p no:cacheprovider \
      ${PYTEST_ARGS:-} tests/test_graph_decode_gpu.py tests/test_patched_model_gpu.py tests/test_live_caches.py \
      tests/test_generate_quant_gpu.py tests/test_decode_attention_gpu.py tests/test_latent_attention_gpu.py || rc=1
  fi
fi
if [ -z "${SKIP_BENCH:-}" ] && [ "$BENCH_SET" = targets ]; then
  for p in nemotron3-nano-like qwen3.5-4b-like; do
    python3 -m replayssm.cli bench --preset "$p" -b 1,256 --variants graphs,graphs-per-step \
      --json "$OUT_DIR/bench_$p.json" 2>&1 | tee "$OUT_DIR/bench_$p.log" || rc=1
    python3 examples/benchmarks/bench_speculative.py --preset "$p" --accept 1 --draft-model none \
      --out "$OUT_DIR/speculative_$p" 2>&1 | tee "$OUT_DIR/bench_speculative_$p.log" || rc=1
  done
elif [ -z "${SKIP_BENCH:-}" ]; then
  python3 examples/benchmarks/bench_kernels.py --out "$OUT_DIR" ${BENCH_ARGS:-} 2>&1 | tee "$OUT_DIR/bench_kernels.log" || rc=1
  python3 examples/benchmarks/bench_verify.py --out "$OUT_DIR" 2>&1 | tee "$OUT_DIR/bench_verify.log" || rc=1
  # verify windows on 16-bit and 8-bit checkpoints
  python3 examples/benchmarks/bench_verify.py --batches 1,256 --T 4 --state-dtypes bfloat16,int8,float8_e4m3fn \
    --out "$OUT_DIR/verify_low_precision" 2>&1 | tee "$OUT_DIR/bench_verify_low_precision.log" || rc=1
  # the batch-1 step's grouped and gated GEMV launches against separate ones
  python3 examples/benchmarks/bench_linear.py --groups --presets qwen3.5-4b-like,kimi-linear-like 2>&1 \
    | tee "$OUT_DIR/bench_linear_groups.log" || rc=1
  # speculative decoding in generate(), batch 1: oracle drafter at several acceptance rates, prompt lookup
  python3 examples/benchmarks/bench_speculative.py --preset nemotron3-nano-like --out "$OUT_DIR" 2>&1 \
    | tee "$OUT_DIR/bench_speculative.log" || rc=1
  # whole-model generate() step, stock / eager / CUDA graphs (BENCH_PRESETS="" skips it)
  for p in ${BENCH_PRESETS-nemotron3-nano-like qwen3.5-4b-like kimi-linear-like}; do
    python3 -m replayssm.cli bench --preset "$p" --json "$OUT_DIR/bench_$p.json" --plot "$OUT_DIR/bench_$p.png" 2>&1 \
      | tee "$OUT_DIR/bench_$p.log" || rc=1
  done
fi
exit $rc
