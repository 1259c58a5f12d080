"""FAKE_SGLANG_SCENARIO parsing: defaults, nested keys, and every kind of bad input named."""

from __future__ import annotations

import signal

import pytest

from supervisor.testing.scenario import (
    GpuFault,
    Scenario,
    ScenarioError,
    injected_value,
    parse_scenario,
)
from tests.testing.support import fake_server_env, run_fake_to_exit


@pytest.mark.parametrize("text", [None, "", "  ", "{}"])
def test_no_scenario_is_the_happy_path(text):
    assert parse_scenario(text) == Scenario()


def test_nested_keys_and_signal_names_are_read():
    scenario = parse_scenario(
        '{"crash": {"rank": 2, "after_s": 1.5, "signal": "SIGSEGV"}, "leak": {"rank": 1,'
        ' "bytes_per_s": 1024}, "orphan": {"kind": "double_fork", "holds_gpu": true},'
        ' "bad_flags": ["--foo"], "gpu_stuck": true, "startup_s": 1}'
    )
    assert scenario.crash is not None
    assert (scenario.crash.rank, scenario.crash.after_s) == (2, 1.5)
    assert scenario.crash.signal == signal.SIGSEGV
    assert scenario.leak is not None
    assert scenario.leak.bytes_per_s == 1024
    assert scenario.orphan is not None
    assert scenario.orphan.kind == "double_fork"
    assert scenario.bad_flags == ("--foo",)
    assert scenario.startup_s == 1.0


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{nope", "not valid JSON"),
        ("[1]", "expected an object"),
        ('{"startup": 1}', "unknown key 'startup'"),
        ('{"startup_s": "1"}', "'startup_s': expected a number"),
        ('{"startup_s": -1}', "'startup_s': must not be negative"),
        ('{"ignore_sigterm": 1}', "'ignore_sigterm': expected true or false"),
        ('{"crash": {"rank": 0}}', "give signal or exit_code"),
        ('{"crash": {"signal": 9, "exit_code": 1}}', "give signal or exit_code"),
        ('{"crash": {"signal": "SIGNOPE"}}', "no signal 'SIGNOPE'"),
        ('{"leak": {"rank": 0, "bytes": 5}}', "unknown key 'leak.bytes'"),
        ('{"leak": {"kind": "heap"}}', "leak.kind"),
        ('{"orphan": {"kind": "fork"}}', "setsid|double_fork"),
        ('{"bad_flags": "--foo"}', "a list of strings"),
        ('{"health_fail_mode": "500"}', "health_fail_mode"),
        # drain_s went away: the drain now lasts as long as requests are in flight.
        ('{"drain_s": 1}', "unknown key 'drain_s'"),
        ('{"request_s": -0.5}', "'request_s': must not be negative"),
        ('{"gpu_fault": {"kind": "xid"}}', "'gpu_fault': xid takes code"),
        ('{"gpu_fault": {"kind": "nope"}}', "'gpu_fault.kind': one of xid, dbe"),
        ('{"gpu_fault": {"kind": "lost", "code": 79}}', "lost takes no code or value"),
        ('{"gpu_fault": {"kind": "recovery-action", "value": "panic"}}', "unknown action"),
        ('{"gpu_fault": {"kind": "xid", "code": "79"}}', "'gpu_fault.code': expected an int"),
    ],
)
def test_bad_scenarios_are_refused_naming_the_problem(text, named):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text)
    assert named in str(info.value)


def test_a_gpu_fault_is_read_with_its_value_as_fake_gpu_inject_takes_it():
    scenario = parse_scenario('{"gpu_fault": {"after_s": 2, "kind": "xid", "code": 79, "rank": 1}}')
    assert scenario.gpu_fault == GpuFault(rank=1, after_s=2.0, kind="xid", code=79)
    assert injected_value(scenario.gpu_fault) == "79"
    action = parse_scenario('{"gpu_fault": {"kind": "recovery-action", "value": "reboot"}}')
    assert action.gpu_fault is not None
    assert injected_value(action.gpu_fault) == "reboot"


def test_stop_keys_default_to_quick_polls_and_sglangs_scheduler_wait():
    scenario = parse_scenario('{"request_s": 2, "drain_poll_s": 0.5}')
    assert (scenario.request_s, scenario.drain_poll_s) == (2.0, 0.5)
    assert Scenario().scheduler_exit_timeout_s == 15.0  # tokenizer_manager.py
    assert Scenario().request_s == 0.0


def test_the_init_fork_is_on_by_default_like_the_real_server_and_can_be_turned_off():
    assert Scenario().init_fork_s == 0.013
    assert parse_scenario('{"init_fork_s": null}').init_fork_s is None
    assert parse_scenario('{"init_fork_s": 2}').init_fork_s == 2.0


def test_a_bad_scale_factor_exits_2():
    env = fake_server_env()
    env["FAKE_SGLANG_BYTES_PER_GB"] = "1MiB"
    result = run_fake_to_exit(["--model-path", "m"], env)
    assert result.returncode == 2
    assert "FAKE_SGLANG_BYTES_PER_GB" in result.stderr


def test_an_output_flood_is_read_and_its_lines_are_what_it_says():
    from supervisor.testing.flood import flood_lines

    scenario = parse_scenario(
        '{"output_flood": {"line_bytes": 5000, "word_chars": 300, "cjk_chars": 20, "rounds": 1}}'
    )
    flood = scenario.output_flood
    assert flood is not None
    assert flood.rounds == 1
    line, word, cjk = flood_lines(flood)
    assert 5000 <= len(line) < 7000
    assert max(len(w) for w in line.split(" ")) >= 1000  # long words, spaced
    assert word == "y" * 300
    assert len(cjk) == 20
    assert " " not in cjk
    assert cjk.isalpha()  # every character a word character to \w
