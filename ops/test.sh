#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set-up, formatting, lints, the dependency
# check (cargo deny, deny.toml), then every test (unit, real processes, real nats-server,
# the real pinned agent CLIs, a real headless Chromium), and where their artifacts are.
#
# The advisory check needs the RustSec database, a git repository on GitHub. Where it
# cannot be fetched (no route to GitHub), it uses the dated snapshot beside the checkout
# (../shared/advisory-db, ops/advisories.sh); with neither, the advisories are reported NOT
# checked and the run goes on; RELAY_REQUIRE_ADVISORIES=1 makes that a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# CI builds everything once, from a clean clone, on a disk it shares: no incremental caches
# (3.5 GB of its 8 GB target there) and no debug info in the test binaries (about half of
# each of some 70 binaries of 40 MB). A failing test still says where it panicked (file
# and line are compiled in); only a backtrace loses its line numbers. ops/setup.sh, called
# next, builds with the same settings, so nothing is built twice.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=false
fi
ops/setup.sh
echo "== cargo fmt --check" >&2
cargo fmt --all --check
echo "== cargo clippy" >&2
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo deny" >&2
# deny reads the metadata of every platform's crates, and a build fetches only this
# one's: fetch the rest first (from crates.io; a no-op when they are here).
cargo fetch --locked --quiet
# Licenses, duplicate versions (warnings) and sources: Cargo.lock and the registry only.
cargo deny --offline check --hide-inclusion-graph bans licenses sources
# Advisories: the live RustSec database where it can be fetched, else the dated snapshot
# in ../shared/advisory-db (ops/advisories.sh says which, and its date).
adv=0
ops/advisories.sh || adv=$?
if [ "$adv" -eq 3 ] && [ "${RELAY_REQUIRE_ADVISORIES:-0}" != 1 ]; then
  echo "test: WARNING: advisories NOT checked: neither the live RustSec database nor a snapshot (above; set RELAY_REQUIRE_ADVISORIES=1 to fail instead)" >&2
elif [ "$adv" -eq 3 ]; then
  echo "test: advisories cannot be checked (above), and RELAY_REQUIRE_ADVISORIES=1: failing" >&2
  exit 1
elif [ "$adv" -ne 0 ]; then
  exit "$adv"
fi
echo "== tests" >&2
status=0
# Two tests per core (4 on CI's 2 cores): most tests spend their time waiting for the
# processes they start (agent CLIs, a browser, nats-server) and for the timeouts they
# test. On 2 cores the whole suite took 461 s with 4 against 507 s with 2, all passing;
# the load tests and the benchmark still run alone (.config/nextest.toml).
threads=$(( $(nproc) * 2 ))
# The JUnit report the failures are summed up from below: this run's, or none.
junit="${CARGO_TARGET_DIR:-target}/nextest/default/junit.xml"
rm -f "$junit"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast --failure-output final --test-threads "$threads" || status=$?
else
  cargo test --workspace --no-fail-fast || status=$?
fi
# CI shows only the head and the tail of a long log: the failures' first lines again, last
# (the test, and where and why it panicked, from nextest's JUnit report).
if [ "$status" -ne 0 ] && [ -f "$junit" ]; then
  echo "test: the failures, in short (all of each above):" >&2
  awk '/<testcase /{match($0, /name="[^"]*"/); name=substr($0, RSTART+6, RLENGTH-7);
         match($0, /classname="[^"]*"/); class=substr($0, RSTART+11, RLENGTH-12)}
       /<failure /{print "  FAIL " class " " name; sub(/.*<failure[^>]*>/, ""); left=8}
       /^stack backtrace:/{left=0}
       left>0 {gsub(/&apos;/, "\047"); gsub(/&quot;/, "\""); gsub(/&lt;/, "<");
               gsub(/&gt;/, ">"); gsub(/&amp;/, "\\&"); print "    " substr($0, 1, 300); left--}' \
    "$junit" >&2
fi
# The browser tests' screenshots (tests/src/browser.rs: artifacts_dir), failed run or not.
artifacts="${RELAY_TEST_ARTIFACTS:-target/test-artifacts}"
case "$artifacts" in /*) ;; *) artifacts="$PWD/$artifacts" ;; esac
echo "test: artifacts (browser screenshots) in $artifacts" >&2
exit "$status"
