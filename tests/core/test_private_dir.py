"""The rule for a directory root keeps its files in: who may own it and the path to it."""

from __future__ import annotations

import pytest

from supervisor.core.private_dir import Entry, Role, owner_and_mode, problem

ROOT, ALICE, NOBODY = 0, 1000, 65534


def entry(uid: int, mode: int, owner: str = "") -> Entry:
    return Entry(path="/x", uid=uid, owner=owner or str(uid), mode=mode)


@pytest.mark.parametrize(
    ("role", "uid", "mode", "euid", "ok"),
    [
        (Role.STATE_DIR, ROOT, 0o700, ROOT, True),
        (Role.STATE_DIR, ROOT, 0o755, ROOT, True),  # StateDirectory='s default
        (Role.STATE_DIR, ROOT, 0o2750, ROOT, True),  # a group that reads status.json
        (Role.STATE_DIR, ROOT, 0o770, ROOT, False),
        (Role.STATE_DIR, ROOT, 0o1777, ROOT, False),  # sticky is no excuse for the dir itself
        (Role.STATE_DIR, NOBODY, 0o700, ROOT, False),
        (Role.STATE_DIR, ROOT, 0o700, ALICE, False),  # root's, and we are alice
        (Role.STATE_DIR, ALICE, 0o700, ALICE, True),
        (Role.ABOVE, ROOT, 0o1777, ROOT, True),  # /tmp
        (Role.ABOVE, ROOT, 0o777, ROOT, False),
        (Role.ABOVE, ROOT, 0o775, ROOT, False),
        (Role.ABOVE, ALICE, 0o755, ROOT, False),  # alice could swap what is below
        (Role.ABOVE, ROOT, 0o755, ALICE, True),
        (Role.LINK, ROOT, 0o777, ALICE, True),
        (Role.LINK, ALICE, 0o777, ALICE, True),
        (Role.LINK, NOBODY, 0o777, ROOT, False),
    ],
)
def test_the_rule(role: Role, uid: int, mode: int, euid: int, ok: bool):
    assert (problem(entry(uid, mode), role, euid) is None) is ok


def test_the_owner_is_named_by_name_and_uid_and_a_links_mode_is_left_out():
    named = owner_and_mode(entry(NOBODY, 0o757, "nobody"))
    assert named == "owned by nobody (uid 65534), mode 0757"
    assert owner_and_mode(entry(4242, 0o700)) == "owned by uid 4242, mode 0700"
    assert owner_and_mode(entry(4242, 0o777), mode=False) == "owned by uid 4242"
