#!/usr/bin/env bash
# One device call that stays inside the run tool's 600 s and keeps what it finished: the machine check
# first (a bad machine stops the call at once, exit 3), then the steps asked for, each started only while
# the call's deadline leaves it time. Session 17 (the first H200 screen of mma-rows' span 2, stream-K and
# prefetch 2). Everything lands in $OUT; screens in $OUT/screens.tar.gz (the device returns at most 8 files).
# Usage: [DEADLINE=560] [STEPS='tests screens sweep table readfloor mmbench decode'] [PROBLEMS='28672x8192:1 ...']
#        [PRIOR='dir ...'] bash ci/device-call.sh
#   tests    every GPU test, 8 workers, then those marked alone (timing host-side launches) without workers
#            (TEST_FILES: files instead of tests/, TEST_K: a -k selection)
#   screens  (SCREEN_NEED: the seconds a screen must have left to start, default 75, more to keep time for later steps)
#            per problem, ci/explore-rows.sh's span-2 sweep (WARPS, UNROLLS, KSPLITS, PREFETCHES, PERSISTS, PQS,
#            LUTS (default pairx; pairx,prmt adds the all-permute decode) as in ci/span-screens.sh) with the
#            served kernel beside; skipped once the deadline is near
#   sweep    any part of the space: SWEEP='knob=v1,v2 ...' (no m) screened at each of SWEEP_PROBLEMS (NxK:M)
#   table    serving entries from this call's screens and those under PRIOR (earlier calls' unpacked
#            screens.tar.gz), merged into tuner/serve/tuned_configs.json here (bring it back: table.json)
#   readfloor a read-only reduction of each target's bytes, torch.sum and 32 Triton reads (ci/read_floor.py --tuned)
#   mmbench  the runtime as served against bnb (ci/gpu-session.sh mmbench)
#   decode   the Llama-3-8B-shaped decode (ci/gpu-session.sh decode)
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1 NF4TUNE_CACHE=${NF4TUNE_CACHE:-$PWD/build/nf4cache}
t0=$SECONDS; DEADLINE=${DEADLINE:-560}
left() { echo $(( DEADLINE - (SECONDS - t0) )); }
want() { case " ${STEPS:-tests screens} " in *" $1 "*) return 0;; esac; return 1; }
log="$OUT/call.txt"
say() { echo "[$(( SECONDS - t0 ))s] $*" | tee -a "$log"; }

nvidia-smi --query-gpu=name,driver_version,pci.bus_id,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$log"
if ! python3 ci/machine_check.py > "$OUT/machine-check.txt" 2>&1; then
  tail -15 "$OUT/machine-check.txt"; say "machine check FAILED: stopping this call"; exit 3
fi
say "machine check clean: $(tail -1 "$OUT/machine-check.txt")"

if want tests; then
  # 8 workers, then the tests that time host-side launches (marked alone) without other workers beside them
  timeout $(( $(left) - 60 )) python3 -m pytest -q -m "gpu and not alone" -p no:cacheprovider -n 8 ${TEST_K:+-k "$TEST_K"} \
    ${TEST_FILES:-tests} > "$OUT/gpu-tests.txt" 2>&1
  say "GPU tests exit $?: $(tail -1 "$OUT/gpu-tests.txt")"
  alone=$(mktemp)                    # appended to gpu-tests.txt (the device returns at most 8 files)
  timeout $(( $(left) - 30 )) python3 -m pytest -q -m "gpu and alone" -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} \
    ${TEST_FILES:-tests} > "$alone" 2>&1
  rc=$?; [ $rc -eq 5 ] && rc=0      # none selected (TEST_FILES / TEST_K without such tests)
  say "GPU tests run alone exit $rc: $(tail -1 "$alone")"
  { echo; echo "==== the tests marked alone, without parallel workers (exit $rc)"; cat "$alone"; } >> "$OUT/gpu-tests.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.txt" | head -20 | tee -a "$log"
fi

screens=$OUT/screens; mkdir -p "$screens"
# screen PROBLEM RUNNER [VAR=VALUE ...]: one problem (NxK:M) through ci/RUNNER with the served kernel beside,
# skipped once fewer than SCREEN_NEED seconds are left
screen() {
  local p=$1 runner=$2; shift 2
  local shape=${p%%:*} m=${p##*:} given
  if [ "$(left)" -lt "${SCREEN_NEED:-75}" ]; then say "skipped $p: $(left) s left"; return; fi
  given=$(python3 ci/served_config.py "$shape" "$m") || { say "no served config for $p"; return; }
  say "$runner $p (served: ${given:-bnb})"
  env OUT="$screens" GIVEN="$given" M="$m" STAGE_TIMEOUT=$(( $(left) - 10 < 150 ? $(left) - 10 : 150 )) TABLES= "$@" \
    bash "ci/$runner" "$shape" 2>&1 | grep -E "^(exhaustive|given)" | cut -c1-220 | tee -a "$log"
}
if want screens; then
  for p in ${PROBLEMS:-28672x8192:1 14336x4096:1}; do
    mt=8; [ "${p##*:}" -gt 4 ] && mt=16
    persists=${PERSISTS:-0,1}; [ "$mt" -eq 16 ] && persists=0      # stream-K takes mtile 8 only
    screen "$p" explore-rows.sh NAME=span SPANS=2 LOADS=16 LUTS=${LUTS:-pairx} MTILES=$mt WARPS=${WARPS:-8,16} \
      UNROLLS=${UNROLLS:-2} KSPLITS=${KSPLITS:-1,2,4} PQS=${PQS:-0} PREFETCHES=${PREFETCHES:-1,2} PERSISTS=$persists
  done
fi
if want sweep; then
  # any part of the space (SWEEP: knob=v1,v2 ..., without m) at SWEEP_PROBLEMS (NxK:M)
  for p in ${SWEEP_PROBLEMS:-}; do
    screen "$p" explore-screen.sh NAME=sweep-m${p##*:} SWEEP="${SWEEP:?SWEEP is required by the sweep step} m=${p##*:}"
  done
fi
if want screens || want sweep; then tar -czf "$OUT/screens.tar.gz" -C "$screens" .; fi

if want table; then
  jsons=$(ls "$screens"/*-m*-*.json 2>/dev/null; for d in ${PRIOR:-}; do ls "$d"/*-m*-*.json 2>/dev/null; done)
  if [ -n "$jsons" ]; then
    new=$(mktemp --suffix .json)       # its entries are printed into call.txt
    python3 ci/table_from_screens.py $jsons -o "$new" | tee -a "$log"
    python3 ci/merge_table.py tuner/serve/tuned_configs.json "$new" -o "$OUT/table.json" | tee -a "$log" \
      && cp "$OUT/table.json" tuner/serve/tuned_configs.json && say "served table merged"
  else
    say "table: no screens"
  fi
fi
# session MODE NEED LINES: ci/gpu-session.sh MODE if NEED seconds are left, its file's last LINES into call.txt
session() {
  if [ "$(left)" -le "$2" ]; then say "skipped $1: $(left) s left"; return; fi
  timeout $(( $(left) - 5 )) bash ci/gpu-session.sh "$1" > /dev/null 2>&1; say "$1 exit $?"
  tail -"$3" "$OUT/$1.txt" 2>/dev/null | tee -a "$log"
}
want mmbench && session mmbench 120 40
want decode && session decode 90 14
want readfloor && session readfloor 100 9
rm -rf "$screens"
say "done"
