#!/usr/bin/env bash
# The one device run: install the shipped wheels (dask, distributed, array-api-compat,
# array-api-strict and their small dependencies) into /tmp/site, then run the GPU check (correctness
# of every op and of fused training steps, then timings against PyTorch eager, float16 against
# float32, host time per captured step), the gpu-marked tests (fused update and cross-entropy
# kernels, capturable cuBLAS, whole-step capture) and the check of training on GPU workers.
# Logs go to "$OUT" when it is set. Needs the repository's .whl folder.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
LOGS="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$LOGS/nvidia-smi.txt"
timeout 330 python3 bench/gpu_check.py --time-limit 200 2>&1 | tee "$LOGS/gpu_check.log"
check=${PIPESTATUS[0]}
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tee "$LOGS/pytest_gpu.log"
tests=${PIPESTATUS[0]}
timeout 120 python3 bench/gpu_cluster_check.py 2>&1 | tee "$LOGS/gpu_cluster_check.log"
cluster=${PIPESTATUS[0]}
echo "gpu_check exit $check, pytest exit $tests, gpu_cluster_check exit $cluster"
exit $(( check != 0 || tests != 0 || cluster != 0 ))
