#!/usr/bin/env bash
# Fuzz each target for MINUTES minutes (default 10), one after the other, one core each:
#
#   scripts/fuzz.sh [MINUTES] [TARGET...]     (no TARGET: every target in fuzz/Cargo.toml)
#
# Builds the cargo-fuzz targets (release, with debug assertions so that overflows panic), then
# runs libFuzzer on each with its committed seeds (fuzz/corpus/TARGET) and found crashes
# (fuzz/regressions/TARGET) as input. New corpus entries go to a scratch directory
# ($FUZZ_SCRATCH, default fuzz/target/scratch/TARGET/corpus), never into the committed corpus;
# a crashing, hanging (10 s) or over-allocating (256 MiB at once, 2 GiB in all) input is saved
# in fuzz/target/scratch/TARGET/artifacts/. Prints per target the CPU seconds, executions,
# coverage (edges and features) and corpus size; exits non-zero if any target found something.
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain, or stable with
# RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

minutes="${1:-10}"
shift || true
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^sectorcrypt-fuzz$')
fi

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi
# FUZZ_BUILD=0: run the binaries built last (while the sources are being edited).
if [ "${FUZZ_BUILD:-1}" != 0 ]; then
    "${fuzz[@]}" build --debug-assertions
fi
bin_dir="target/x86_64-unknown-linux-gnu/release"
scratch_root="${FUZZ_SCRATCH:-target/scratch}"

found=0
printf '%-16s %8s %12s %8s %8s %7s  %s\n' target cpu_s execs cov ft corpus result
for target in "${targets[@]}"; do
    scratch="$scratch_root/$target"
    mkdir -p "$scratch/corpus" "$scratch/artifacts" "corpus/$target"
    inputs=("$scratch/corpus" "corpus/$target")
    [ -d "regressions/$target" ] && inputs+=("regressions/$target")
    log="$scratch/fuzz.log"
    status=0
    # A copy: a rebuild during the run must not replace the binary under it.
    cp "$bin_dir/$target" "$scratch/$target.bin"
    # -close_fd_mask=1: the targets' own output would drown the log.
    /usr/bin/time -f 'cpu %U %S' -o "$scratch/time" \
        "$scratch/$target.bin" "${inputs[@]}" \
        -max_total_time=$((minutes * 60)) -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
        -print_final_stats=1 -close_fd_mask=1 -artifact_prefix="$scratch/artifacts/" \
        >"$log" 2>&1 || status=$?
    cpu=$(awk '/^cpu/ { printf "%.0f", $2 + $3 }' "$scratch/time")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    last=$(grep -E '#[0-9]+.*cov: ' "$log" | tail -n 1)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corpus=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$last")
    result=ok
    if [ "$status" -ne 0 ]; then
        found=1
        result="FOUND (exit $status): $(ls "$scratch/artifacts" | tr '\n' ' ')see $log"
    fi
    printf '%-16s %8s %12s %8s %8s %7s  %s\n' "$target" "$cpu" "${execs:-?}" "${cov:-?}" "${ft:-?}" \
        "${corpus:-?}" "$result"
done
exit "$found"
