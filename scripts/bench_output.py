#!/usr/bin/env python3
"""Benchmark the cost of one pathological server output line (not a test): masking it, reading
it through the output splitter, and masking it as a log event value. Results: BENCHMARKS.md.

    .venv/bin/python scripts/bench_output.py [--timeout 30] [--repeat 5] [--source DIR]

Each case runs in a child process killed after --timeout seconds ("> N s": it did not finish),
so that a quadratic version can be measured too: --source names another checkout whose
`supervisor` package is imported instead of this one (e.g. a `git worktree` of an older commit).
Each case runs --repeat times in its child; the median is shown.

    redact      core/redact.py's shapes over the whole text (no cap: the patterns alone)
    pipeline    the bytes through adapters/output_lines.py (the line cap), decoded, then masked
                with a Redactor that knows one secret, as the output pump does
    log value   supervisor/log.py's scrub of the text as an event value
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1 << 20

# name -> Python expression of the text (evaluated in the child, so the parent stays small)
CASES = {
    "1 MB line": f"('GET /v1/completions?prompt=' + 'x' * 200 + ' ') * ({MB} // 227)",
    "1 MB word": f"'x' * {MB}",
    "8,000-char word": "'x' * 8000",
    "16,000-char word": "'x' * 16000",
    "200,000-char word": "'x' * 200000",
    "8,000 CJK chars": "'\u6f22\u5b57\u304b\u306a\u4ea4\u3058\u308a\u6587' * 1000",
}

CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
text = eval(sys.argv[2])
what = sys.argv[3]
if what == "redact":
    from supervisor.core.redact import redact_line
    work = lambda: redact_line(text)
elif what == "pipeline":
    from supervisor.adapters.output_lines import split_lines
    from supervisor.core.redact import Redactor
    redact = Redactor(["sk-bench-secret-value"])
    data = [text.encode() + b"\n"]
    def work():
        reads = iter(data)
        for raw in split_lines(lambda: next(reads, b"")):
            redact(raw.decode("utf-8", errors="replace"))
else:
    from supervisor import log
    work = lambda: log.scrub({"line": text})
times = []
for _ in range(int(sys.argv[4])):
    start = time.perf_counter()
    work()
    times.append(time.perf_counter() - start)
print(sorted(times)[len(times) // 2])
"""


def measure(source: Path, text_expr: str, what: str, timeout_s: float, repeat: int) -> float | None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(source), text_expr, what, str(repeat)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return None
    return float(done.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (the median)")
    parser.add_argument("--source", type=Path, default=ROOT, help="checkout to import from")
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args()
    print(f"source {args.source.resolve()} (python {sys.version.split()[0]})")
    for name, expr in CASES.items():
        row: dict[str, object] = {"case": name}
        cells = []
        for what in ("redact", "pipeline", "log value"):
            seconds = measure(args.source, expr, what, args.timeout, args.repeat)
            row[what] = seconds
            shown = f"> {args.timeout:g} s" if seconds is None else f"{seconds:.4f} s"
            cells.append(f"{what} {shown}")
        print(json.dumps(row) if args.json else f"{name:<20} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
