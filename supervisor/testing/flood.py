"""The scenario's `output_flood`: the main process prints pathological lines over and over.

What a real SGLang prints with `--log-requests` when a client sends a long prompt (it logs the
request's text in one line, utils/request_logger.py), or what a library dumps without a
newline: a line of about `line_bytes` made of long words, one word of `word_chars` characters
without a space, and `cjk_chars` of CJK text without a space (every character a word character
to a Unicode regex). A thread of the main process writes them to stderr, pausing `every_s`
between rounds, from `after_s` after start until the process ends (or `rounds` are done).
"""

from __future__ import annotations

import sys
import threading
import time

from supervisor.testing.scenario import OutputFlood

_CJK = "漢字かな交じり文"


def flood_lines(flood: OutputFlood) -> tuple[str, ...]:
    """The round's lines, built once (about line_bytes + word_chars + 3 × cjk_chars bytes)."""
    word = "x" * 1000 + " "
    prompt = word * max(1, -(-flood.line_bytes // len(word)))  # at least line_bytes
    return (
        f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Receive: obj=GenerateReqInput(text='{prompt}')",
        "y" * flood.word_chars,
        (_CJK * (flood.cjk_chars // len(_CJK) + 1))[: flood.cjk_chars],
    )


def _print_rounds(flood: OutputFlood) -> None:
    time.sleep(flood.after_s)
    lines = flood_lines(flood)
    done = 0
    while flood.rounds is None or done < flood.rounds:
        for line in lines:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        done += 1
        time.sleep(flood.every_s)


def start_flood(flood: OutputFlood | None) -> None:
    """Print the flood from a daemon thread (none without the scenario key)."""
    if flood is not None:
        threading.Thread(target=_print_rounds, args=(flood,), name="flood", daemon=True).start()
