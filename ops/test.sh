#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set-up, formatting, lints, then every
# test (unit, real processes, real nats-server, the real pinned agent CLIs).
set -euo pipefail
cd "$(dirname "$0")/.."
ops/setup.sh
echo "== cargo fmt --check" >&2
cargo fmt --all --check
echo "== cargo clippy" >&2
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== tests" >&2
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast --failure-output final
else
  cargo test --workspace --no-fail-fast
fi
