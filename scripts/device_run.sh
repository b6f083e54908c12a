#!/usr/bin/env bash
# One call on a lent GPU machine: the CUDA tests, the host-cost benchmarks if asked, then an experiment
# as a Hydra multirun (one job per workload; with several GPUs, side by side through hydra/launcher=gpus).
# What to commit lands in $OUT (at most 8 files come back): cuda_tests.log, <experiment>.log,
# <experiment name>_records.jsonl.gz, and with BENCH=1 replay.jsonl, sizes.jsonl and pi_nodes.txt.
#
#   GRACE_GIT_COMMIT=<sha sent> bash scripts/device_run.sh full 'workload=ALNET,DLRM,EOS'
#   TESTS=0 GRACE_GIT_COMMIT=<sha> bash scripts/device_run.sh full 'workload=ALNET,DLRM' hydra/launcher=gpus gpus=2
#   TESTS=0 GRACE_GIT_COMMIT=<sha> bash scripts/device_run.sh suite [overrides for every session]
#
# The experiment is stopped (SIGINT) LIMIT seconds (default 570) after the script started, so that the
# records of every finished workload come back from a call limited to 600 s; the workload it stopped is
# recorded as interrupted and measured whole by the next call.
#
# Needs the wheels of hydra-core, omegaconf, antlr4, the launcher plugins and pytest-xdist in .whl/
# (docs/harness.md, "On a lent GPU"). The machine's .git is the session's first snapshot: pass the commit
# you sent as GRACE_GIT_COMMIT.
set -uo pipefail
experiment=$1
shift
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python3 -c "import hydra_plugins.hydra_joblib_launcher" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
# A warm machine keeps ignored paths between calls, but its results/ come as sent: the records of its
# earlier calls, kept in $stash, are taken in first, so that this call plans from all it measured (twice
# a warm call's planner sent again a workload that the call before had just measured)
stash=.device_records
[ -d "$stash" ] && python3 scripts/take_records.py "$stash"
# the records files this call wrote to (an experiment's records go to its experiment_name's folder)
started=$(mktemp)
# gzipped: a file comes back only under 16 MiB, which the H100's full records outgrew (a call's were lost);
# renamed into place, so that a call stopped mid-copy brings back the last whole copy
save_records() {
  find results -name records.jsonl -newer "$started" -exec sh -c 'f="$2/$(basename "$(dirname "$(dirname "$1")")")_records.jsonl.gz"; gzip -1 -c "$1" > "$f.part" && mv "$f.part" "$f"' _ {} "$out" \;
  mkdir -p "$stash" && cp "$out"/*_records.jsonl.gz "$stash"/ 2>/dev/null
}
# Every step runs under what is left of LIMIT (a step that would start with under 20 s left is not started).
left() { echo $(( ${LIMIT:-570} - SECONDS )); }
step() { [ "$(left)" -gt 20 ] && timeout -s INT -k 10 "$(left)" "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
if [ "${TESTS:-1}" = 1 ]; then
  step python3 -m pytest -q -m cuda -n 4 --dist loadfile -p no:cacheprovider --durations=12 2>&1 | grep --line-buffered -v '^USDT' > "$out/cuda_tests.log"
  tail -3 "$out/cuda_tests.log"
fi
if [ "${BENCH:-0}" = 1 ]; then
  step python3 scripts/replay_overhead.py 2>&1 | tail -4
  step python3 scripts/pi_microbench.py 2>&1 | tail -9
  step python3 scripts/pi_nodes.py > "$out/pi_nodes.txt" 2>&1
  cp results/replay_overhead/*/replay.jsonl results/pi_microbench/*/sizes.jsonl "$out/" 2>/dev/null
fi
[ -n "${EXTRA:-}" ] && step bash -c "$EXTRA" > "$out/extra.log" 2>&1
# The records are copied out every 15 s as well: a call that runs past its limit still brings back those made.
( while sleep 15; do save_records; done ) &
saver=$!
experiment_log() { step python3 run.py -m "$@" 2>&1 | grep --line-buffered -v '^USDT' >> "$out/$experiment.log"; }
if [ "$experiment" = suite ]; then
  # Session after session, each planned from the records so far by scripts/suite_jobs.py, while one fits
  # what is left of LIMIT; where none fits a whole call, one never measured here has the call to itself
  # (only a call that the tests or EXTRA took nothing of: in what they left, it would be stopped for sure)
  fit=--fit
  first=$(( $(left) > ${LIMIT:-570} - 60 ))
  while [ "$(left)" -gt 60 ]; do
    if ! plan=$(python3 scripts/suite_jobs.py --call $(( ${LIMIT:-570} - 30 )) --seconds $(( $(left) - 30 )) $fit); then
      [ -n "$fit" ] && [ "$first" = 1 ] && fit= && continue
      break
    fi
    first=0
    echo "suite: $plan" | tee -a "$out/$experiment.log"
    # shellcheck disable=SC2086  # the plan is words: experiment, workloads, variants
    experiment_log experiment=$plan "$@"
    [ -z "$fit" ] && break
  done
else
  experiment_log experiment="$experiment" "$@"
fi
kill $saver
tail -5 "$out/$experiment.log"
save_records
ls "$out"
