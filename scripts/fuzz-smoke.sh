#!/usr/bin/env bash
# Coverage-guided fuzzing smoke run on stable Rust (AFL++ through cargo-afl): installs cargo-afl
# if missing (its install builds AFL++ from the source it ships), builds the four targets of
# fuzz/ with AFL++ instrumentation, fuzzes each for FUZZ_SECONDS seconds (default 20) from its
# committed corpus, and fails if any input crashed or hung a target. Findings stay in
# fuzz/out/<target>/ (crashes/, hangs/, queue/). See fuzz/README.md.
#
#   scripts/fuzz-smoke.sh                     # every target, 20 s each
#   FUZZ_SECONDS=300 scripts/fuzz-smoke.sh review offline
#
# Environment: FUZZ_BUILD_ONLY=1 (install and build, then stop: .ci/run does that in the
# background long before the run), FUZZ_SECONDS (per target), FUZZ_TIMEOUT_MS (a run over it is a hang; default
# 1000), AFL_OPT_LEVEL (the targets' opt-level, default 3; 1 builds faster), CARGO_AFL_VERSION
# (default 0.18.2).
set -euo pipefail

cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-20}"
timeout_ms="${FUZZ_TIMEOUT_MS:-1000}"
version="${CARGO_AFL_VERSION:-0.18.2}"
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=(review offline agent_env epoch)
fi

start=$(date +%s)
stamp() { echo "[fuzz-smoke +$(($(date +%s) - start))s] $*"; }

if ! cargo afl --version >/dev/null 2>&1; then
    stamp "installing cargo-afl $version (builds AFL++)"
    cargo install cargo-afl --locked --version "$version"
fi
# A no-op ("already built") when the install built AFL++ for this rustc; builds it otherwise.
cargo afl config --build >/dev/null 2>&1 || true

stamp "building the targets with AFL++ instrumentation"
cargo afl build --release --locked --features afl
if [ "${FUZZ_BUILD_ONLY:-}" = 1 ]; then
    stamp "built (FUZZ_BUILD_ONLY)"
    exit 0
fi

# No core-dump helper, no CPU frequency or affinity tuning on shared CI machines; no UI.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1 \
    AFL_NO_UI=1 AFL_QUIET=1 AFL_SUPPRESS_CRASH_NOTIFY=1
failed=0
for target in "${targets[@]}"; do
    out="out/$target"
    rm -rf "$out"
    mkdir -p out
    stamp "fuzzing $target for ${seconds}s"
    # -V: stop after that many seconds; -t: a run over that many ms is a hang.
    cargo afl fuzz -i "corpus/$target" -o "$out" -x "dict/$target.dict" -V "$seconds" \
        -t "$timeout_ms" "target/release/$target" >"out/$target.log" 2>&1 || {
        stamp "afl-fuzz failed on $target:"
        tail -n 30 "out/$target.log"
        failed=1
        continue
    }
    stats="$out/default/fuzzer_stats"
    execs=$(awk -F': *' '/^execs_done/ {print $2}' "$stats")
    paths=$(awk -F': *' '/^corpus_count/ {print $2}' "$stats")
    crashes=$(find "$out/default/crashes" -type f -name 'id:*' | wc -l)
    hangs=$(find "$out/default/hangs" -type f -name 'id:*' | wc -l)
    stamp "$target: $execs executions, corpus $paths, $crashes crashes, $hangs hangs"
    if [ "$crashes" -gt 0 ] || [ "$hangs" -gt 0 ]; then
        failed=1
        for file in "$out"/default/crashes/id:* "$out"/default/hangs/id:*; do
            [ -f "$file" ] || continue
            echo "--- $file (replay: cd fuzz && cargo run --bin $target -- '$file')"
            head -c 2000 "$file" | cat -v
            echo
        done
    fi
done
stamp "done"
exit "$failed"
