"""The run loop in-process on a fake clock: which processes of a loading tree are its ranks."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.core.events import SignalEvent
from tests.fakes.server import FakeServer, rank
from tests.run.runner_support import LOAD_S, WARM_S, names, runner, settings, world

SIGTERM = SignalEvent(signal.SIGTERM, "SIGTERM")


def test_a_schedulers_forked_child_before_the_other_rank_has_its_title_is_no_death(
    tmp_path: Path,
):
    """What a real TP 2 server did as it loaded: TP0 ran a subprocess that carried its title
    while TP1 was still a bare spawn child; the child's exit was once read as a rank's death."""
    w = world(tmp_path)

    def start(server: FakeServer) -> None:
        w.on_start(server)
        tp0, tp1 = sorted(server.ranks)
        titled = server.ranks[tp1]
        server.ranks[tp1] = dataclasses.replace(titled, title="python -c from multiprocessing")
        child = rank(tp1 + 100, "sglang::scheduler_TP0   ", ppid=tp0)
        now = w.clock.now
        w.events.call_at(now + 0.5, lambda: server.ranks.update({child.pid: child}))
        w.events.call_at(now + 1.0, lambda: server.ranks.__delitem__(child.pid))
        w.events.call_at(now + 2.0, lambda: server.ranks.update({tp1: titled}))

    w.launcher.on_start = start
    w.events.at(LOAD_S + WARM_S + 5.0, SIGTERM)
    run = runner(w, settings(tmp_path), watch_gpus=False)
    with capture_logs() as logs:
        assert run.run() == 0
    assert names(logs) == [
        *("launching", "loading", "warming", "ready", "stopping", "stopped"),
    ]
    assert len(w.launcher.started) == 1
