"""The watchdog has the restart-smaller size written before it signals the tree: durably before
a SIGTERM; before a SIGKILL without waiting, then durably once the tree is signalled; a failing
write never stops a kill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from supervisor.core.events import KillReason
from tests.memory.test_watchdog import GB, KILLED, LIMITS, FakeTree, SimHost, make


class Recording(FakeTree):
    """Puts the signals and the shrink writes in one list, in the order they happened."""

    def __init__(self, done: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.done = done

    def kill_all(self, reason: KillReason) -> tuple[int, ...]:
        self.done.append("SIGKILL")
        return super().kill_all(reason)

    def terminate(self, reason: KillReason) -> None:
        self.done.append("SIGTERM")
        super().terminate(reason)


def _keeper(done: list[str]) -> Any:
    return lambda urgent: done.append("keep urgent" if urgent else "keep")


def test_the_shrink_is_kept_before_a_sigterm_and_before_and_after_a_sigkill(tmp_path: Path):
    """Before a SIGTERM durably (it has its grace); before a SIGKILL without waiting on the
    disk, then durably once the tree is signalled."""
    done: list[str] = []
    tree = Recording(done)
    dog, events, clock = make(tree, tmp_path, host=SimHost(other=278 * GB))
    dog.keep_shrink = _keeper(done)
    dog.tick()
    assert done == ["keep", "SIGTERM"]
    clock.now += LIMITS.terminate_grace_s
    dog.tick()
    assert done == ["keep", "SIGTERM", "keep urgent", "SIGKILL", "keep"]
    done.clear()
    killed = Recording(done, shmem=60 * GB)
    dog, events, _clock = make(killed, tmp_path)
    dog.keep_shrink = _keeper(done)
    dog.tick()
    assert done == ["keep urgent", "SIGKILL", "keep"]
    assert [e.action for e in events] == [KILLED]


def test_a_failing_shrink_write_never_stops_the_kill(tmp_path: Path):
    tree = FakeTree(shmem=60 * GB)
    dog, events, _ = make(tree, tmp_path)

    def broken(urgent: bool) -> None:
        raise RuntimeError("a bug in the shrink")

    dog.keep_shrink = broken
    with capture_logs() as logs:
        dog.tick()
    assert tree.killed
    assert [e.action for e in events] == [KILLED]
    assert [e["event"] for e in logs].count("hicache_shrink_not_saved") == 2
