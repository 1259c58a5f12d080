"""A simulated descendant that escapes the server's process group (the `orphan` scenario).

`python -m supervisor.testing.orphan KIND GPU GPU_BYTES LIFETIME_S TITLE`: KIND "setsid" (started
in a new session by its rank) or "double_fork" (fork, setsid, fork: reparented at once to init or
the nearest subreaper). It holds GPU_BYTES on GPU (-1: none) and always ends on its own after
LIFETIME_S, so it never outlives a test run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from supervisor.testing import gpu_state
from supervisor.testing.ranks import set_title


def main(argv: list[str]) -> None:
    kind, gpu, gpu_bytes, lifetime_s, title = argv
    if kind == "double_fork":
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
    set_title(title.replace("{pid}", str(os.getpid())))
    state_dir = os.environ.get("FAKE_GPU_STATE_DIR")
    if int(gpu) >= 0 and state_dir:
        gpu_state.register_holder(Path(state_dir), int(gpu), int(gpu_bytes))
    # A bounded life: an orphan that nobody kills still goes away (the hygiene rule).
    time.sleep(float(lifetime_s))


if __name__ == "__main__":
    main(sys.argv[1:])
