#!/usr/bin/env bash
# Installs what Relay and its tests need, idempotently: tmux, nats-server, and Chromium
# with its chromedriver (the dashboard's browser tests) from Debian packages, the pinned
# agent CLIs from npm into a cache outside the checkout (keyed by version, so a fresh
# clone does not download them again), cargo-deny, and the debug build of every target.
#
#   ops/setup.sh                 everything the test suite needs
#   ops/setup.sh --run           only what running Relay needs (tmux, npm, the agent
#                                CLIs): no nats-server, browser, cargo-deny or debug
#                                build (ops/up.sh uses this, beside its release build)
#   ops/setup.sh --no-agents     skip the agent CLIs
#   ops/setup.sh --no-test-tools skip cargo-deny (ops/test.sh's dependency check)
set -euo pipefail
cd "$(dirname "$0")/.."

want_agents=1
want_test_tools=1
want_test_pkgs=1
want_build=1
for a in "$@"; do
  case "$a" in
    --run) want_test_tools=0; want_test_pkgs=0; want_build=0 ;;
    --no-agents) want_agents=0 ;;
    --no-test-tools) want_test_tools=0 ;;
    *) echo "setup: unknown option $a (see the top of ops/setup.sh)" >&2; exit 2 ;;
  esac
done

say() { printf 'setup: %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------
need_pkgs=()
command -v tmux >/dev/null 2>&1 || need_pkgs+=(tmux)
# relay's allocator, jemalloc, is built from its C sources (tikv-jemalloc-sys): make and cc.
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
command -v cc >/dev/null 2>&1 || need_pkgs+=(gcc)
[ "$want_agents" -eq 0 ] || command -v npm >/dev/null 2>&1 || need_pkgs+=(npm)
if [ "$want_test_pkgs" -eq 1 ]; then
  command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || need_pkgs+=(nats-server)
  # Where the browser tests look for them (tests/src/browser.rs), whatever is on PATH.
  [ -x /usr/bin/chromium ] || need_pkgs+=(chromium)
  [ -x /usr/bin/chromedriver ] || need_pkgs+=(chromium-driver)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  say "installing ${need_pkgs[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# --- pinned agent CLIs -----------------------------------------------------------------
# Versions are pinned once, in harnesses/src/pinned.rs (see shared/HARNESSES.md); read here.
pinned() { # source-file constant
  local v
  v=$(grep -rh "^pub const $2: &str = " "$1" | sed -n "s/^pub const $2: &str = \"\(.*\)\";/\1/p" | head -n1)
  [ -n "$v" ] || { echo "setup: cannot read $2 from $1" >&2; exit 1; }
  echo "$v"
}
CODEX_VERSION=$(pinned harnesses/src/pinned.rs CODEX_VERSION) || exit 1
CLAUDE_VERSION=$(pinned harnesses/src/pinned.rs CLAUDE_VERSION) || exit 1
PI_VERSION=$(pinned harnesses/src/pinned.rs PI_VERSION) || exit 1
GEMINI_VERSION=$(pinned harnesses/src/pinned.rs GEMINI_VERSION) || exit 1
OPENCODE_VERSION=$(pinned harnesses/src/pinned.rs OPENCODE_VERSION) || exit 1
QWEN_VERSION=$(pinned harnesses/src/pinned.rs QWEN_VERSION) || exit 1
# As harnesses/src/pinned.rs: RELAY_AGENTS_DIR, else $XDG_CACHE_HOME/relay/agents.
AGENTS_DIR="${RELAY_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/relay/agents}"
install_npm() { # name version package binary
  local dir="$AGENTS_DIR/$1-$2"
  if [ -x "$dir/node_modules/.bin/$4" ]; then
    return 0
  fi
  say "installing $3@$2 into $dir (npm)"
  mkdir -p "$dir.tmp"
  (cd "$dir.tmp" && npm install --no-audit --no-fund --no-update-notifier --loglevel=error --prefix . "$3@$2" >/dev/null)
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
}
if [ "$want_agents" -eq 1 ]; then
  # All at once: each is mostly a download. OpenCode's install script (run by npm)
  # links its platform's binary as bin/opencode; the ACP agents run with node >= 20.
  pids=()
  install_npm codex "$CODEX_VERSION" @openai/codex codex & pids+=($!)
  install_npm claude "$CLAUDE_VERSION" @anthropic-ai/claude-code claude & pids+=($!)
  install_npm pi "$PI_VERSION" @mariozechner/pi-coding-agent pi & pids+=($!)
  install_npm gemini "$GEMINI_VERSION" @google/gemini-cli gemini & pids+=($!)
  install_npm opencode "$OPENCODE_VERSION" opencode-ai opencode & pids+=($!)
  install_npm qwen "$QWEN_VERSION" @qwen-code/qwen-code qwen & pids+=($!)
  for p in "${pids[@]}"; do wait "$p"; done
fi

# --- test tools ------------------------------------------------------------------------
# cargo-deny, pinned, built from crates.io into ~/.cargo/bin once (a few minutes).
CARGO_DENY_VERSION=0.20.2
if [ "$want_test_tools" -eq 1 ] && ! cargo deny --version 2>/dev/null | grep -qx "cargo-deny $CARGO_DENY_VERSION"; then
  say "installing cargo-deny $CARGO_DENY_VERSION (cargo install --locked)"
  cargo install --locked --quiet "cargo-deny@$CARGO_DENY_VERSION"
fi

# --- Rust build ------------------------------------------------------------------------
if [ "$want_build" -eq 1 ]; then
  # Every target the tests run, in one build: built for the binaries alone, the
  # dev-dependencies' features (chrono's clock, for prometheus-parse) would build the
  # MCP stack (chrono, schemars, rmcp, relay-cli) a second time for the tests.
  say "building (cargo build --workspace --all-targets)"
  cargo build --workspace --all-targets --quiet
fi
