"""The reservation ledger's rules: which entries count against a starting instance."""

from __future__ import annotations

from supervisor.core.ledger import Reservation, document, others, parse, replace_own

GB = 10**9


def entry(pid: int, planned: int, pinned: int = 0, instance: str = "a") -> Reservation:
    return Reservation(
        instance=instance,
        pid=pid,
        start_ticks=pid * 10,
        planned_bytes=planned,
        pinned_bytes=pinned,
    )


def alive_except(*dead: int):
    return lambda pid, ticks: pid not in dead and ticks == pid * 10


def test_only_live_other_supervisors_with_bytes_still_to_pin_count():
    entries = (
        entry(1, 100 * GB, 40 * GB),  # 60 GB to go
        entry(2, 50 * GB),  # me
        entry(3, 80 * GB),  # dead
        entry(4, 30 * GB, 31 * GB),  # pinned more than planned: nothing to go
    )
    counted = others(entries, self_pid=2, is_alive=alive_except(3))
    assert [e.pid for e in counted] == [1]
    assert counted[0].outstanding_bytes == 60 * GB


def test_a_reused_pid_does_not_keep_a_dead_entry_alive():
    reused = Reservation(instance="b", pid=7, start_ticks=1, planned_bytes=GB)
    assert others((reused,), self_pid=2, is_alive=alive_except()) == ()


def test_setting_an_entry_replaces_the_old_one_and_drops_the_dead():
    entries = (entry(1, GB), entry(2, 2 * GB), entry(3, 3 * GB))
    mine = entry(2, 5 * GB, instance="me")
    after = replace_own(entries, 2, mine, alive_except(3))
    assert after == (entries[0], mine)
    assert replace_own(after, 2, None, alive_except()) == (entries[0],)


def test_a_damaged_document_or_entry_is_skipped_not_fatal():
    good = entry(1, GB)
    doc = document([good])
    doc["reservations"] += [
        {"instance": "x"},  # fields missing
        {"instance": "x", "pid": "nan", "start_ticks": 1, "planned_bytes": 1},
        {"instance": "x", "pid": 5, "start_ticks": 1, "planned_bytes": -1},
        "not an entry",
    ]
    assert parse(doc) == (good,)
    assert parse([1, 2]) == ()
    assert parse({"reservations": "none"}) == ()
