#!/usr/bin/env bash
# fuzz/run.sh BUILD SECONDS HARNESS...: each harness for SECONDS over its committed
# corpus (fuzz/corpus/<harness>, read only: new inputs go to BUILD/work/<harness>).
# Fails when a harness crashes, leaks, or goes over its memory limits; the input that
# did it is left in BUILD/artifacts/ and named in the output.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$1 seconds=$2
shift 2

# A harness may set its own libFuzzer options in fuzz/<harness>.options, one per line
# (fuzz_control's allocation cap lives there).
status=0
for h in "$@"; do
    work=$build/work/$h arts=$build/artifacts
    mkdir -p "$work" "$arts" "fuzz/corpus/$h"
    opts=(-max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1
          -artifact_prefix="$arts/$h-")
    [ -f "fuzz/$h.dict" ] && opts+=(-dict="fuzz/$h.dict")
    [ -f "fuzz/$h.options" ] && mapfile -t -O ${#opts[@]} opts < <(grep -v '^#' "fuzz/$h.options")
    log=$build/$h.log
    "$build/$h" "${opts[@]}" "$work" "fuzz/corpus/$h" >"$log" 2>&1
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
