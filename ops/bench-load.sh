#!/usr/bin/env bash
# Concurrent invocations (HTTP clients and NATS invokers) against this build's relay and
# a baseline build of another commit, interleaved in one run; prints flights/s per client
# mix, the longest GET /v1/status during each load, and the ratio this/baseline.
#
#   ops/bench-load.sh                      # baseline: the commit before the storage thread
#   BASELINE=<rev> ops/bench-load.sh --rounds 5 --mix 1x0,32x64
#
# Extra arguments go to relay-load (see `target/release/relay-load --help`). The
# baseline is built once per commit into target/bench-baseline/ (a git worktree).
set -euo pipefail
cd "$(dirname "$0")/.."
BASELINE="${BASELINE:-acdd1b0}"
rev=$(git rev-parse --short "$BASELINE")
base_dir="target/bench-baseline/src-$rev"
base_target="target/bench-baseline/target"
say() { printf 'bench-load: %s\n' "$*" >&2; }

ops/setup.sh --no-agents
say "building this tree (release)"
cargo build --release --workspace --bins --quiet
if [ ! -x "$base_target/release/relay-$rev" ]; then
  say "building the baseline $rev (release) in $base_dir"
  [ -d "$base_dir" ] || git worktree add --detach -f "$base_dir" "$rev" >/dev/null
  (cd "$base_dir" && CARGO_TARGET_DIR="$PWD/../target" cargo build --release --bin relay --quiet)
  cp "$base_target/release/relay" "$base_target/release/relay-$rev"
fi
exec target/release/relay-load \
  --relay "baseline-$rev=$base_target/release/relay-$rev" \
  --relay "this=target/release/relay" "$@"
