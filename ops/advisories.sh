#!/usr/bin/env bash
# The advisory check of ops/test.sh: `cargo deny check advisories` (deny.toml) against the
# RustSec database, and which database and date it used.
#
# The live database is a git repository on GitHub, fetched into cargo-deny's own db-path.
# Where that fetch fails (no route to GitHub), the check runs against the dated snapshot
# beside the checkout, ../shared/advisory-db (files only; its SNAPSHOT names the upstream
# commit and date): cargo-deny reads a git repository, so the files are committed into one
# under target/advisory-snapshot/ (author and committer date = the snapshot's, so the
# staleness cargo-deny sees is the snapshot's), rebuilt only when SNAPSHOT changes, and
# cargo-deny runs --offline with a copy of deny.toml whose db-path points there.
#
# With neither, the advisories are reported NOT checked and the exit status is 3 (ops/test.sh
# goes on unless RELAY_REQUIRE_ADVISORIES=1); an advisory found fails (status 1).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'advisories: %s\n' "$*" >&2; }

# A fetch that cannot connect ends in at most 5 minutes, never waits for a prompt.
if GIT_TERMINAL_PROMPT=0 timeout 300 cargo deny fetch db; then
  say "database: the live RustSec advisory-db (fetched now into cargo-deny's db-path)"
  exec cargo deny --offline check --hide-inclusion-graph advisories
fi

# Where the snapshot is looked for, first found wins: RELAY_ADVISORY_SNAPSHOT; beside this
# checkout; beside the checkout this one was cloned from, when that is a local path (a
# clean clone made elsewhere, e.g. for a CI run, still finds its origin's neighbour).
candidates=()
[ -n "${RELAY_ADVISORY_SNAPSHOT:-}" ] && candidates+=("$RELAY_ADVISORY_SNAPSHOT")
candidates+=("../shared/advisory-db")
origin="$(git config --get remote.origin.url 2>/dev/null || true)"
case "$origin" in
  /*) candidates+=("$origin/../shared/advisory-db") ;;
  file://*) candidates+=("${origin#file://}/../shared/advisory-db") ;;
esac
snapshot=""
for c in "${candidates[@]}"; do
  if [ -f "$c/SNAPSHOT" ]; then snapshot="$(cd "$c" && pwd)"; break; fi
  # An explicit RELAY_ADVISORY_SNAPSHOT that is not there is not silently replaced.
  [ -n "${RELAY_ADVISORY_SNAPSHOT:-}" ] && break
done
if [ -z "$snapshot" ]; then
  say "NOT checked: the live RustSec database cannot be fetched (above) and there is no snapshot (no SNAPSHOT file in: ${candidates[*]})"
  exit 3
fi
commit="$(sed -n 's/^commit //p' "$snapshot/SNAPSHOT")"
date="$(sed -n 's/^date //p' "$snapshot/SNAPSHOT")"
if [ -z "$commit" ] || [ -z "$date" ]; then
  say "NOT checked: $snapshot/SNAPSHOT names no commit or date"
  exit 3
fi

root="$PWD/target/advisory-snapshot"
mkdir -p "$root"
# deny.toml, with the db-path of the snapshot (cargo-deny takes no db-path on its command
# line); the rest of the file, ignores and their reasons included, is the same.
config="$root/deny.toml"
sed 's|^\[advisories\]$|[advisories]\ndb-path = "'"$root/dbs"'"|' deny.toml >"$config"
grep -q "^db-path = \"$root/dbs\"" "$config" || { say "NOT checked: deny.toml has no [advisories] section"; exit 3; }

# The directory cargo-deny expects for the RustSec URL (its last segment and a hash of
# it): asked from cargo-deny itself, which names it when it is missing.
dir="$(cargo deny --offline --config "$config" check advisories 2>&1 | grep -o "$root/dbs/advisory-db-[0-9a-f]*" | head -n 1 || true)"
if [ -z "$dir" ]; then
  dir="$(find "$root/dbs" -mindepth 1 -maxdepth 1 -type d -name 'advisory-db-*' 2>/dev/null | head -n 1)"
fi
if [ -z "$dir" ]; then
  say "NOT checked: cannot tell which directory cargo-deny reads the RustSec database from"
  exit 3
fi
message="RustSec advisory-db snapshot $commit ($date)"
if [ "$(git -C "$dir" log -1 --format=%s 2>/dev/null || true)" != "$message" ]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -R "$snapshot/." "$dir/"
  chmod -R u+w "$dir"
  git -C "$dir" init -q
  git -C "$dir" add -A
  GIT_AUTHOR_DATE="$date" GIT_COMMITTER_DATE="$date" \
    git -C "$dir" -c user.name=relay-ops -c user.email=relay-ops@localhost \
    -c commit.gpgsign=false commit -q -m "$message"
fi
say "database: the snapshot in $snapshot, upstream commit $commit of $date (the live database could not be fetched)"
exec cargo deny --offline --config "$config" check --hide-inclusion-graph advisories
