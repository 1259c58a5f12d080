#!/usr/bin/env bash
# Benchmark: wall time and peak RSS of one pre-flight in a fresh process, measured with GNU time.
# Compares with the interpreter's own start-up and, when an interpreter with SGLang is given
# (SGLANG_PYTHON=/path/to/python), with importing SGLang's argument module.
#
#   scripts/bench_preflight.sh [RUNS]        (default 10 runs; prints median and max)
#
# Not a timed test: numbers depend on the machine; record them in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
py=${PYTHON:-.venv/bin/python}
cli=${CLI:-$(dirname "$py")/sglang-supervisor}
config=configs/kimi-k2.5-8x-rtx-pro-6000.toml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gnu_time=/usr/bin/time
if ! "$gnu_time" -v true >/dev/null 2>&1; then
    echo "GNU time missing: apt-get install time" >&2
    exit 2
fi

# Runs "$@" $runs times under GNU time; prints "label  median_s  max_s  median_rss_mib  max_rss_mib".
measure() {
    local label=$1
    shift
    local walls=() rsss=() out
    for _ in $(seq "$runs"); do
        # The pre-flight exits 1 on the seed box (it does not fit): that is the expected answer.
        "$gnu_time" -f '%e %M' -o "$tmp/time" "$@" >/dev/null 2>&1 || true
        out=$(tail -1 "$tmp/time")
        walls+=("${out% *}")
        rsss+=("${out#* }")
    done
    printf '%s\n' "${walls[@]}" | sort -n >"$tmp/walls"
    printf '%s\n' "${rsss[@]}" | sort -n >"$tmp/rss"
    local mid=$(((runs + 1) / 2))
    local w_med w_max r_med r_max
    w_med=$(sed -n "${mid}p" "$tmp/walls")
    w_max=$(tail -1 "$tmp/walls")
    r_med=$(sed -n "${mid}p" "$tmp/rss")
    r_max=$(tail -1 "$tmp/rss")
    printf '%-44s wall median %5.2f s  max %5.2f s   peak RSS median %6.1f MiB  max %6.1f MiB\n' \
        "$label" "$w_med" "$w_max" "$(awk "BEGIN{print $r_med/1024}")" "$(awk "BEGIN{print $r_max/1024}")"
}

echo "runs per line: $runs   python: $("$py" -c 'import sys; print(sys.version.split()[0])')"
echo "first (coldest) pre-flight, full GNU time -v report:"
"$gnu_time" -v "$cli" preflight --config "$config" 2>&1 >/dev/null |
    grep -E 'Elapsed \(wall clock\)|Maximum resident set size' | sed 's/^/    /' || true
measure "python -c pass (interpreter floor)" "$py" -c pass
measure "sglang-supervisor preflight --config (seed)" "$cli" preflight --config "$config"
measure "  same, --json" "$cli" preflight --json --config "$config"
# Measured host: reads /proc/meminfo, the cgroup tree, NUMA nodes and every /proc/*/fd.
measure "preflight measuring this host (no GPU read)" "$cli" preflight --gpu-backend none -- \
    --model-path configs/models/kimi-k2.5 --tp 8 --enable-hicache --hicache-size 48 --port 39999
if [[ -n "${SGLANG_PYTHON:-}" ]]; then
    measure "import sglang.srt.server_args" "$SGLANG_PYTHON" -c 'import sglang.srt.server_args'
else
    echo "import sglang.srt.server_args: skipped (set SGLANG_PYTHON to an interpreter with SGLang)"
fi
