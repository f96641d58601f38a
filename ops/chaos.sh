#!/usr/bin/env bash
# The chaos test's longer run: kill -9 of the broker, a `relay node` and nats-server at
# random (seeded) points while 32 clients (16 HTTP, 16 NATS) invoke agents half of which
# live on the node; prints each round's figures (kills, flights, completed, failed by a
# cut turn) and any violation: a flight lost, stuck, run twice, failed without having
# started, more failed than the kills could cut, or `relay doctor` not clean. Exits 1 on
# a violation. The suite runs a bounded round (tests/tests/load.rs, chaos_*).
#
#   ops/chaos.sh                                   # 5,000 invocations over 24 agents, 30 kills
#   ops/chaos.sh --agents 80 --invocations 20000 --kills 120 --rounds 3 --seed 42
#
# Arguments go to relay-chaos (see `target/debug/relay-chaos --help`). It uses the debug
# build (a release build takes long on a small machine; the chaos is about correctness,
# not speed); RELAY_CHAOS_PROFILE=release to use a release build instead.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${RELAY_CHAOS_PROFILE:-debug}"
say() { printf 'chaos: %s\n' "$*" >&2; }

command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || ops/setup.sh --no-agents --no-test-tools
flag=()
[ "$profile" = release ] && flag=(--release)
say "building relay, relay-instant-codex and relay-chaos ($profile)"
cargo build "${flag[@]}" --quiet -p relay-cli -p relay-tests --bins
export RELAY_BIN="$PWD/target/$profile/relay"
export RELAY_INSTANT_CODEX_BIN="$PWD/target/$profile/relay-instant-codex"
exec "target/$profile/relay-chaos" "$@"
