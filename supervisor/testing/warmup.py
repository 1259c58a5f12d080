"""SGLang's warm-up thread when its own HTTP server could not bind: it still runs, against
whatever answers on the port.

Imitated (sglang/srt/entrypoints/http_server.py, 0.5.23): the lifespan starts `_wait_and_warmup`
on a thread before uvicorn binds (lines 450-454) and joins it at shutdown (lines 467-468), so a
failed bind waits for it. `_execute_server_warmup` asks `GET /model_info` up to 120 times, 1 s
apart with a 5 s limit each, then sends one `POST /generate`; a failure logs "Initialization
failed. warmup error: …" and kills the tree, the main process included (`kill_process_tree`).
On success it logs "The server is fired up and ready to roll!", although the server answering
is not this one. uvicorn then exits 3 (STARTUP_FAILURE).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from supervisor.testing import stopping
from supervisor.testing.ranks import log

_POLL_S = 1.0  # time.sleep(1) before each look
_LOOK_TIMEOUT_S = 5.0
_GENERATE_TIMEOUT_S = 600.0


def _url(host: str, port: int) -> str:
    # ServerArgs.url(): a wildcard host is reached over loopback
    target = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{target}:{port}"


def _model_info(base: str, tries: int) -> str | None:
    """None once /model_info answered 200; else the last error."""
    last = "no try"
    for _ in range(tries):
        time.sleep(_POLL_S)
        try:
            with urllib.request.urlopen(f"{base}/model_info", timeout=_LOOK_TIMEOUT_S) as got:
                if got.status == 200:
                    return None
                last = f"status {got.status}"
        except (OSError, ValueError) as exc:  # URLError, refused, timed out, reset
            last = repr(exc)
    return last


def warm_up_elsewhere(host: str, port: int, tries: int) -> None:
    """The warm-up against the port's holder; on failure, the tree killed as SGLang kills it."""
    base = _url(host, port)
    error = _model_info(base, tries)
    if error is None:
        body = json.dumps(
            {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 8}}
        ).encode()
        request = urllib.request.Request(f"{base}/generate", data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=_GENERATE_TIMEOUT_S):
                pass
        except (OSError, ValueError) as exc:
            error = repr(exc)
    if error is not None:
        log("", f"Initialization failed. warmup error: {error}")
        stopping.kill_process_tree(include_parent=True)
        return
    log("", "The server is fired up and ready to roll!")
