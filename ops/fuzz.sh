#!/usr/bin/env bash
# The fuzz targets (tests/tests/fuzz/: every decoder of bytes from outside Relay) run for
# longer than the test suite runs them, one after another, then a table of inputs and
# crashes per target.
#
#   ops/fuzz.sh                 60 seconds per target
#   ops/fuzz.sh 300             300 seconds per target
#   ops/fuzz.sh 30 http sled    30 seconds for the targets whose names hold `http` or `sled`
#   ops/fuzz.sh --cases 100000  100000 inputs per target
#
# A crash prints the shrunk input and RELAY_FUZZ_SEED=... to replay it
# (`RELAY_FUZZ_SEED=... cargo test -p relay-tests --test fuzz TARGET`); the exit status
# is then 1. The log of the run is target/fuzz/last.log.
set -euo pipefail
cd "$(dirname "$0")/.."

budget=(RELAY_FUZZ_SECS=60)
if [ "${1:-}" = "--cases" ]; then
  budget=(RELAY_FUZZ_CASES="${2:?--cases takes a number}")
  shift 2
elif [ -n "${1:-}" ] && [ "${1#*[!0-9.]}" = "$1" ]; then
  budget=(RELAY_FUZZ_SECS="$1")
  shift
fi

# The HTTP target runs the `relay` binary: build it, and the targets, first.
cargo build --quiet -p relay-cli
cargo test --quiet -p relay-tests --test fuzz --no-run

mkdir -p target/fuzz
log=target/fuzz/last.log
: >"$log"
status=0
# One target at a time (each alone on the machine, its own figures), all of them or the
# ones the arguments name.
targets="$(cargo test --quiet -p relay-tests --test fuzz -- --list 2>/dev/null | sed -n 's/: test$//p')"
for t in $targets; do
  if [ "$#" -gt 0 ]; then
    keep=0
    for want in "$@"; do
      case "$t" in *"$want"*) keep=1 ;; esac
    done
    [ "$keep" -eq 1 ] || continue
  fi
  echo "fuzz: $t (${budget[*]})" >&2
  env "${budget[@]}" cargo test --quiet -p relay-tests --test fuzz -- --exact "$t" --nocapture \
    >>"$log" 2>&1 || status=1
done

echo
printf '%-34s %14s %8s %10s\n' target inputs crashes seconds
grep -E '^fuzz [a-z_]+: [0-9]+ inputs, [0-9]+ crashes' "$log" |
  sed -E 's/^fuzz ([a-z_]+): ([0-9]+) inputs, ([0-9]+) crashes \(seed [0-9a-f]+, ([0-9.]+) s\)$/\1 \2 \3 \4/' |
  awk '{ printf "%-34s %14d %8d %10.1f\n", $1, $2, $3, $4; n += $2; c += $3 } END { printf "%-34s %14d %8d\n", "total", n, c }'
if [ "$status" -ne 0 ]; then
  echo
  echo "fuzz: a target failed; its shrunk input and seed are in $log:" >&2
  grep -E -A30 'panicked|shrunk input|RELAY_FUZZ_SEED' "$log" | head -80 >&2
fi
exit "$status"
