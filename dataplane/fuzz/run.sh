#!/usr/bin/env bash
# fuzz/run.sh OUT HARNESS...: each harness (the path of a libFuzzer program) for
# $FUZZ_SECONDS (default 30) over its committed corpus (fuzz/corpus/<name>, read only: new
# inputs go to OUT/work/<name>). Fails when a harness crashes, leaks, or goes over its
# memory limits; the input that did it is left in OUT/artifacts/ and named in the output.
# `meson compile -C <build dir> fuzz-run` (-Dfuzz=true) runs every harness with OUT = the
# build dir.
set -uo pipefail
seconds=${FUZZ_SECONDS:-30}
out=$(realpath "$1")
shift
harnesses=()
for h in "$@"; do harnesses+=("$(realpath "$h")"); done
cd "$(dirname "$0")/.."

# A harness may set its own libFuzzer options in fuzz/<name>.options, one per line
# (fuzz_control's allocation cap lives there).
status=0
for path in "${harnesses[@]}"; do
    h=$(basename "$path")
    work=$out/work/$h arts=$out/artifacts
    mkdir -p "$work" "$arts" "fuzz/corpus/$h"
    opts=(-max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1
          -artifact_prefix="$arts/$h-")
    [ -f "fuzz/$h.dict" ] && opts+=(-dict="fuzz/$h.dict")
    [ -f "fuzz/$h.options" ] && mapfile -t -O ${#opts[@]} opts < <(grep -v '^#' "fuzz/$h.options")
    log=$out/$h.log
    "$path" "${opts[@]}" "$work" "fuzz/corpus/$h" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ $rc -eq 0 ]; then
        echo "fuzz $h: ${runs:-?} runs in ${seconds}s, no crash"
    else
        echo "fuzz $h: FAILED (exit $rc) after ${runs:-?} runs; log $log:"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|artifact_prefix|Test unit written|.*runtime error)' "$log" | head -20
        status=1
    fi
done
exit $status
