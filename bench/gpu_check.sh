#!/usr/bin/env bash
# The GPU check for a CUDA machine: the gpu-marked tests, then bench/gpu.py.
#   bash bench/gpu_check.sh [OUT_DIR]       (OUT_DIR defaults to $OUT, else ./gpu-check)
# The machine has torch but not our other requirements: wheels in .whl/ (made here with `pip download`, see
# docs/performance.md) are installed to /tmp/site first. W&B is not installed there: WANDB_MODE=disabled.
set -o pipefail
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# our package as a newcomer installs it (its trainers/ and configs/ install as launcher.trainers, launcher.configs)
python3 -m pip install -q --no-deps --no-index --no-build-isolation --disable-pip-version-check -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' | tee -a "$out/device.txt"
timeout "${GPU_TESTS_S:-240}" python3 -m pytest -p no:cacheprovider -m gpu -v -rs --timeout 200 \
    tests/test_features_gpu.py tests/test_fork.py tests/test_hangs_gpu.py tests/test_metrics_units.py 2>&1 | tee "$out/tests.log"
echo "tests rc ${PIPESTATUS[0]}"
timeout "${GPU_BENCH_S:-420}" python3 bench/gpu.py --quick ${GPU_BENCH_ONLY:+--only $GPU_BENCH_ONLY} --json "$out/gpu.json" 2>&1 | tee "$out/bench.log"
echo "bench rc ${PIPESTATUS[0]}"
