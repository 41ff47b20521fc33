#!/usr/bin/env bash
# Installs the cargo subcommands CI and the release use, each at its pinned version, when it is
# missing or at another version: one place for the pins (update them by hand: a new release must
# not change what CI checks or what dist/ holds). cargo-afl is pinned in scripts/fuzz-smoke.sh,
# whose install also builds AFL++.
#
#   scripts/cargo-tool.sh machete cyclonedx
set -euo pipefail

install_pinned() {
  local crate="$1" version="$2" subcommand="$3"
  if [[ "$(cargo "$subcommand" --version 2>/dev/null || true)" != *"$version"* ]]; then
    cargo install --locked --version "$version" "$crate"
  fi
}

[[ $# -gt 0 ]] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
for tool in "$@"; do
  case "$tool" in
  # Every dependency of the product, the test kit and the fuzz targets is used (.ci/run).
  machete) install_pinned cargo-machete 0.9.2 machete ;;
  # The release's SBOM (scripts/dist.sh).
  cyclonedx) install_pinned cargo-cyclonedx 0.5.9 cyclonedx ;;
  *)
    echo "cargo-tool.sh: no pinned tool $tool (machete, cyclonedx)" >&2
    exit 2
    ;;
  esac
done
