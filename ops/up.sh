#!/usr/bin/env bash
# Sets up what is missing, builds Relay (release), and runs the broker with its embedded
# runtime on the default data dir (RELAY_DATA_DIR, else ~/.local/share/relay).
# Extra arguments go to `relay up` (for example --listen 127.0.0.1:0).
set -euo pipefail
cd "$(dirname "$0")/.."
ops/setup.sh --no-test-tools
cargo build --release --bin relay --quiet
exec target/release/relay up "$@"
