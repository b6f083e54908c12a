#!/usr/bin/env bash
# One call on the GPU machine: the CUDA tests, then an experiment that stops starting workloads after a
# time budget (rerun to resume). Records, logs and the test report land in $OUT, to be committed.
#
#   GRACE_GIT_COMMIT=<sha sent> bash scripts/device_run.sh baselines 420   # experiment, budget in seconds
#   TESTS=0 bash scripts/device_run.sh baselines 480 shard=0/2
#
# Needs the hydra-core, omegaconf and antlr4 wheels in .whl/ (README: "Running on a lent GPU").
set -uo pipefail
experiment=$1 budget=$2
shift 2
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -m cuda -p no:cacheprovider 2>&1 | grep -v '^USDT' > "$out/cuda_tests.log"
  tail -3 "$out/cuda_tests.log"
fi
python3 run.py experiment="$experiment" budget_s="$budget" "$@" 2>&1 | grep -v '^USDT' > "$out/$experiment.log"
tail -5 "$out/$experiment.log"
cp results/"$experiment"/*/records.jsonl "$out/" 2>/dev/null
ls "$out"
