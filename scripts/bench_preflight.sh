#!/usr/bin/env bash
# Benchmark: cold wall time of one pre-flight in a fresh process, paired in the same run with the
# interpreter's own start-up (`python -c pass`), and peak RSS.
#
#   scripts/bench_preflight.sh [RUNS]          (default 30 rounds; prints a markdown table)
#   SRC=/tmp/other-checkout scripts/bench_preflight.sh   (that tree's code, this venv)
#   SGLANG_PYTHON=/opt/sglang/.venv/bin/python scripts/bench_preflight.sh  (adds SGLang's import)
#   WARMUP=3 RSS_RUNS=5 TIMER=hyperfine|bash  (the defaults: hyperfine when installed)
#
# Wall time is measured by hyperfine (apt-get install hyperfine), one run of every command per
# round, the order reversed every other round: a slow spell of a shared machine lands on both
# sides of a ratio. Without hyperfine, bash's $EPOCHREALTIME times the same interleaved rounds
# (GNU time's %e counts in 10 ms steps, as coarse as the whole interpreter start-up).
# Warm-up runs (page cache, bytecode) are dropped and counted; no other run is dropped.
# Peak RSS: GNU time (apt-get install time), RSS_RUNS runs of each command.
#
# Not a timed test: numbers depend on the machine; record them in BENCHMARKS.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-30}
warmup=${WARMUP:-3}
rss_runs=${RSS_RUNS:-5}
py=${PYTHON:-$root/.venv/bin/python}
cli=${CLI:-$(dirname "$py")/sglang-supervisor}
src=${SRC:-$root}
if [[ -n "${SRC:-}" ]]; then
    # The console script imports from PYTHONPATH, `python -m` from the working directory.
    export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
fi
cd "$src"
config=configs/kimi-k2.5-8x-rtx-pro-6000.toml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# With PYTHONDONTWRITEBYTECODE set, an editable install would recompile every changed module on
# every run (~20 ms); an installed wheel has its bytecode from pip. Measure the installed state.
"$py" -m compileall -q supervisor >/dev/null

labels=("python -c pass")
cmds=("$py -c pass")
codes=("0")
labels+=("sglang-supervisor preflight --config (seed)")
cmds+=("$cli preflight --config $config")
codes+=("1") # the seed launch does not fit: exit 1 is the expected answer
labels+=("python -m supervisor preflight --config (seed)")
cmds+=("$py -m supervisor preflight --config $config")
codes+=("1")
labels+=("same, --json")
cmds+=("$cli preflight --json --config $config")
codes+=("1")
# Measured host: /proc/meminfo, the cgroup tree, NUMA nodes, every /proc/*/fd, a port bind.
labels+=("preflight measuring this host (no GPU read)")
cmds+=("$cli preflight --gpu-backend none -- --model-path configs/models/kimi-k2.5 --tp 8 --enable-hicache --hicache-size 48 --port 39999")
codes+=("0,1")
if [[ -n "${SGLANG_PYTHON:-}" ]]; then
    labels+=("import sglang.srt.server_args")
    cmds+=("$SGLANG_PYTHON -c 'import sglang.srt.server_args'")
    codes+=("0")
fi

# One round: every command once, in the given order of indexes; appends "label<TAB>s<TAB>rc".
round() {
    local i start rc
    if [[ $tool == hyperfine ]]; then
        local args=()
        for i in "$@"; do args+=(-n "${labels[$i]}" "${cmds[$i]}"); done
        hyperfine -N -i -w 0 -r 1 --style none --export-json "$tmp/round.json" "${args[@]}" \
            >/dev/null 2>&1
        "$py" -c '
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["command"], r["times"][0], r["exit_codes"][0], sep="\t")' "$tmp/round.json"
        return
    fi
    for i in "$@"; do
        start=$EPOCHREALTIME
        rc=0
        eval "${cmds[$i]}" >/dev/null 2>&1 || rc=$?
        printf '%s\t%s\t%s\n' "${labels[$i]}" "$(awk "BEGIN{print $EPOCHREALTIME - $start}")" "$rc"
    done
}

tool=${TIMER:-bash} # TIMER=bash: the fallback even where hyperfine is installed
if [[ -z "${TIMER:-}" ]] && command -v hyperfine >/dev/null; then tool=hyperfine; fi
forward=$(seq 0 $((${#cmds[@]} - 1)))
backward=$(seq $((${#cmds[@]} - 1)) -1 0)
echo "python $("$py" -c 'import sys; print(sys.version.split()[0])'), supervisor from $src/supervisor,"
echo "timer: $tool, $runs interleaved rounds, $warmup warm-up rounds dropped, $(nproc) CPUs"
for _ in $(seq "$warmup"); do
    # shellcheck disable=SC2086  # the index lists split into arguments on purpose
    round $forward >>"$tmp/warmup.tsv"
done
for r in $(seq "$runs"); do
    # shellcheck disable=SC2086
    if ((r % 2)); then round $forward; else round $backward; fi >>"$tmp/rounds.tsv"
done

"$py" - "$tmp/rounds.tsv" "$tmp/warmup.tsv" "${labels[@]}" -- "${codes[@]}" <<'EOF'
import statistics
import sys

rounds_file, warmup_file, *rest = sys.argv[1:]
labels, codes = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
times: dict[str, list[float]] = {label: [] for label in labels}
bad = []
for line in open(rounds_file):
    label, seconds, rc = line.rstrip("\n").split("\t")
    times[label].append(float(seconds) * 1000)
    if rc not in codes[labels.index(label)].split(","):
        bad.append(f"{label}: exit {rc}")
dropped = {label: 0 for label in labels}
for line in open(warmup_file):
    dropped[line.split("\t")[0]] += 1
floor = times[labels[0]]
print()
print("| Command | n | median | min … max | IQR | dropped | × `python -c pass` (per-round ratios: median, IQR) |")
print("|---|---|---|---|---|---|---|")
for label in labels:
    t = times[label]
    q1, _, q3 = statistics.quantiles(t, n=4, method="inclusive")
    ratios = [a / b for a, b in zip(t, floor)]
    r1, rmed, r3 = statistics.quantiles(ratios, n=4, method="inclusive")
    ratio = "1" if label == labels[0] else f"{rmed:.2f} ({r1:.2f} … {r3:.2f})"
    print(
        f"| {label} | {len(t)} | {statistics.median(t):.1f} ms | {min(t):.1f} … {max(t):.1f} ms "
        f"| {q1:.1f} … {q3:.1f} ms | {dropped[label]} warm-up | {ratio} |"
    )
if bad:
    print("\nunexpected exit codes (the numbers above are not pre-flights):", *bad, sep="\n  ")
    sys.exit(3)
EOF

gnu_time=/usr/bin/time
if ! "$gnu_time" -f '%M' true >/dev/null 2>&1; then
    echo "peak RSS: skipped (GNU time missing: apt-get install time)"
    exit 0
fi
echo
echo "peak RSS (GNU time %M, median of $rss_runs runs):"
for i in 0 1 4; do
    for _ in $(seq "$rss_runs"); do
        eval "$gnu_time -f %M -o $tmp/rss -- ${cmds[$i]}" >/dev/null 2>&1 || true
        tail -1 "$tmp/rss"
    done | sort -n | awk -v label="${labels[$i]}" '{ v[NR] = $1 }
        END { printf "  %-46s %6.1f MiB\n", label, v[int((NR + 1) / 2)] / 1024 }'
done
