#!/usr/bin/env bash
# Builds Relay (release), puts `relay` on your PATH, installs what running agents needs
# (tmux, the pinned agent CLIs; beside the build, not after it), and runs the broker with
# its embedded runtime on the default data dir ($XDG_DATA_HOME/relay, else
# ~/.local/share/relay; RELAY_DATA_DIR or --data-dir for another).
# Extra arguments go to `relay up` (for example --listen 127.0.0.1:0).
#
# `relay` is installed into $RELAY_BIN_DIR, else ~/.cargo/bin (on PATH wherever rustup
# set up Rust), else ~/.local/bin; a copy, so cleaning the checkout keeps it working.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'up: %s\n' "$*" >&2; }

ops/setup.sh --run &
setup=$!
say "building relay (cargo build --release; the first build takes a few minutes)"
cargo build --release --locked --bin relay --quiet
if ! wait "$setup"; then
  say "setting up the agent CLIs failed (above); relay runs, but agents need them"
fi

bin_dir="${RELAY_BIN_DIR:-}"
if [ -z "$bin_dir" ]; then
  if [ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]; then
    bin_dir="${CARGO_HOME:-$HOME/.cargo}/bin"
  else
    bin_dir="$HOME/.local/bin"
  fi
fi
mkdir -p "$bin_dir"
# Through a temporary name: a relay running from there keeps its file.
install -m 0755 target/release/relay "$bin_dir/.relay.new"
mv -f "$bin_dir/.relay.new" "$bin_dir/relay"
case ":$PATH:" in
  *":$bin_dir:"*) say "installed $bin_dir/relay" ;;
  *) say "installed $bin_dir/relay; it is not on your PATH: export PATH=\"$bin_dir:\$PATH\"" ;;
esac
exec "$bin_dir/relay" up "$@"
