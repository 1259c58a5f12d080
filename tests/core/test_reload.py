"""core.reload: which changed keys a reload applies at once, at the server's next launch, or
only when the supervisor restarts."""

from __future__ import annotations

import pytest

from supervisor.core.reload import Applies, applies, plan_reload


@pytest.mark.parametrize(
    ("key", "when"),
    [
        ("run.health_interval", Applies.NOW),
        ("run.failure_threshold", Applies.NOW),
        ("run.log_level", Applies.NOW),
        ("watchdog.kill", Applies.NOW),
        ("hooks.on_ready", Applies.NOW),  # a whole section read at each event
        ("server.args", Applies.NEXT_LAUNCH),
        ("server.env", Applies.NEXT_LAUNCH),
        ("host.mem_available", Applies.NEXT_LAUNCH),
        ("run.health_path", Applies.NEXT_LAUNCH),
        ("watchdog.enabled", Applies.NEXT_LAUNCH),
        ("server.user", Applies.NEXT_START),  # credentials resolved once, at start
        ("preflight.ledger_dir", Applies.NEXT_START),  # in a section otherwise read per launch
        ("run.state_dir", Applies.NEXT_START),
        ("gpu.backend", Applies.NEXT_START),
        ("http.listen", Applies.NEXT_START),
        ("newsection.anything", Applies.NEXT_START),  # unknown: never claimed as applied
    ],
)
def test_each_key_takes_effect_when_what_reads_it_reads_it_again(key: str, when: Applies) -> None:
    assert applies(key) is when


def test_a_plan_sorts_the_changed_keys_and_ignores_the_unchanged() -> None:
    old = {"run.health_interval": 10.0, "server.args": ("--tp", "2"), "gpu.backend": "auto"}
    new = {"run.health_interval": 1.0, "server.args": ("--tp", "2"), "gpu.backend": "none"}
    plan = plan_reload(old, new, restart_on_reload=True)
    assert (plan.now, plan.next_launch, plan.next_start) == (
        ("run.health_interval",),
        (),
        ("gpu.backend",),
    )
    assert plan.restart_server is False  # nothing a relaunch would apply
    assert plan.changed == ("run.health_interval", "gpu.backend")


def test_restart_on_reload_restarts_only_for_what_waits_for_a_launch() -> None:
    old = {"server.env": {}, "run.health_interval": 10.0}
    new = {"server.env": {"HF_HOME": "/data"}, "run.health_interval": 10.0}
    assert plan_reload(old, new, restart_on_reload=True).restart_server is True
    waiting = plan_reload(old, new, restart_on_reload=False)
    assert (waiting.next_launch, waiting.restart_server) == (("server.env",), False)


def test_a_key_on_one_side_only_counts_as_changed() -> None:
    plan = plan_reload({}, {"hooks.on_fatal": ("notify",)}, restart_on_reload=False)
    assert plan.now == ("hooks.on_fatal",)
    assert plan_reload({"a.b": 1}, {"a.b": 1}, restart_on_reload=True).changed == ()
