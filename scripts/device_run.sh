#!/usr/bin/env bash
# One call on the GPU machine: the CUDA tests, the host-cost benchmarks if asked, then an experiment that
# stops starting workloads after a time budget (rerun to resume). Everything to commit lands in $OUT
# (at most 8 files come back): cuda_tests.log, <experiment>.log, <experiment>_records.jsonl, and with
# BENCH=1 replay.jsonl, sizes.jsonl and pi_nodes.txt; with SHARDS=2 also <experiment>_b.log and
# cuda_tests_tp.log (the two-GPU tests, run on both GPUs beside the one-GPU tests, which SHARDS=2 splits
# between the GPUs; TP_TESTS=0 leaves the two-GPU tests out).
#
#   GRACE_GIT_COMMIT=<sha sent> bash scripts/device_run.sh baselines 420      # experiment, budget in s
#   TESTS=0 BENCH=1 GRACE_GIT_COMMIT=<sha> bash scripts/device_run.sh full 300 shard=0/3
#   TESTS=0 MULTIRUN=1 GRACE_GIT_COMMIT=<sha> bash scripts/device_run.sh tp 300 tp=2,1   # a Hydra multirun
#   SHARDS=2 GRACE_GIT_COMMIT=<sha> bash scripts/device_run.sh full 420 force=2026-11-30T10:30
#     (two GPUs: the tests on both, then a sweep on each, GPU 0's after the benchmarks: each takes the next workload
#     the other has not claimed (claims=<folder>), pinned to half of the cores (CPUS, taskset) so that one
#     side's compiling does not steal the other's timing cores; both append to the one records file,
#     each record under a lock; GPU 1's log comes back as <experiment>_b.log)
#
# The experiment is stopped (SIGINT) LIMIT seconds (default 570) after the script started, so that the
# records of every finished workload still come back from a call limited to 600 s.
#
# Needs the hydra-core, omegaconf and antlr4 wheels in .whl/ (README: "Running on a lent GPU"). The
# machine's .git is the session's first snapshot: pass the commit you sent as GRACE_GIT_COMMIT.
set -uo pipefail
experiment=$1 budget=$2
shift 2
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python3 -c "import hydra" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
pin=${CPUS:+taskset -c $CPUS}
save_records() { cp results/"$experiment"/*/records.jsonl "$out/${experiment}_records.jsonl" 2>/dev/null; }
# Every step runs under what is left of LIMIT (a step that would start with under 20 s left is not
# started): on the first call of a session the CUDA tests alone took 8.5 min on the two-GPU kind, and a
# benchmark started after them ran past the call's limit, losing every file of the call.
left() { echo $(( ${LIMIT:-570} - SECONDS )); }
step() { [ "$(left)" -gt 20 ] && timeout -s INT -k 10 "$(left)" $pin "$@"; }
if [ "${SHARDS:-1}" = 2 ]; then
  half=$(( $(nproc) / 2 ))
  export LIMIT=$(( ${LIMIT:-570} - SECONDS ))
  claims=$(mktemp -d /tmp/claims-XXXXXX)
  side() {  # side <gpu> <first core> <out> [VAR=value ...]: one GPU's tests, benchmarks and sweep
    local gpu=$1 first=$2 dir=$3
    shift 3
    env "$@" CUDA_VISIBLE_DEVICES=$gpu CPUS=$first-$(( first + half - 1 )) SHARDS=1 OUT=$dir \
      LIMIT=$(( LIMIT - SECONDS )) bash "$0" "$experiment" "$budget" claims="$claims" "${args[@]}"
  }
  args=("$@")
  SECONDS=0
  # The CUDA tests first, on both GPUs at once (about 4 min; 5.3 min on GPU 0 alone): the two-GPU tests
  # on both; beside them the HuggingFace training test (2.5 min) on GPU 1 and the other one-GPU tests
  # (2.7 min) on GPU 0. Then a sweep on each GPU, so that no test runs beside a timed sweep.
  if [ "${TESTS:-1}" = 1 ]; then
    [ "${TP_TESTS:-1}" = 1 ] && step python3 -m pytest -q -m cuda -p no:cacheprovider --durations=5 tests/test_tp_cuda.py 2>&1 | grep -v '^USDT' > "$out/cuda_tests_tp.log" &
    hf=tests/test_cuda.py::test_grace_trains_huggingface_models_right
    step env CUDA_VISIBLE_DEVICES=1 python3 -m pytest -q -m cuda -p no:cacheprovider --durations=5 "$hf" 2>&1 | grep -v '^USDT' > /tmp/cuda_tests_b.log &
    step env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -m cuda -p no:cacheprovider --durations=12 --deselect "$hf" 2>&1 | grep -v '^USDT' > "$out/cuda_tests.log"
    wait
    cat /tmp/cuda_tests_b.log >> "$out/cuda_tests.log"
    tail -qn1 /tmp/cuda_tests_b.log "$out/cuda_tests.log" "$out/cuda_tests_tp.log" 2>/dev/null
  fi
  side 0 0 "$out" TESTS=0 &
  side 1 "$half" /tmp/out_b TESTS=0 BENCH=0 > /dev/null 2>&1
  wait
  cp /tmp/out_b/"$experiment".log "$out/${experiment}_b.log"
  tail -3 "$out/${experiment}_b.log"
  save_records
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
if [ "${TESTS:-1}" = 1 ]; then
  step python3 -m pytest -q -m cuda -p no:cacheprovider --durations=12 2>&1 | grep -v '^USDT' > "$out/cuda_tests.log"
  tail -3 "$out/cuda_tests.log"
fi
if [ "${BENCH:-0}" = 1 ]; then
  step python3 scripts/replay_overhead.py 2>&1 | tail -4
  step python3 scripts/pi_microbench.py 2>&1 | tail -9
  step python3 scripts/pi_nodes.py > "$out/pi_nodes.txt" 2>&1
  cp results/replay_overhead/*/replay.jsonl results/pi_microbench/*/sizes.jsonl "$out/" 2>/dev/null
fi
# deadline: when the step will be stopped (a workload that took longer last time than is left is passed over)
deadline=$(date -u -d "+$(( $(left) - 10 )) seconds" +%Y-%m-%dT%H:%M:%S)
# The records are copied out every 15 s as well: a call that ran past its limit (TP ranks slow to stop) lost
# every record of its sweep when only the copy after it was made.
( while sleep 15; do save_records; done ) &
saver=$!
step python3 run.py ${MULTIRUN:+-m} experiment="$experiment" budget_s="$budget" deadline="$deadline" "$@" 2>&1 | grep -v '^USDT' > "$out/$experiment.log"
kill $saver
tail -5 "$out/$experiment.log"
save_records
ls "$out"
