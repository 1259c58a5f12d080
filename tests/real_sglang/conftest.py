"""The real-SGLang lane (marker real_sglang, deselected from the default run): every test here
skips with one line when the lane's environment is not built, and fails instead under CI=true,
where a lane that did not run must not pass for one that did. Each module marks itself
(`pytestmark = LANE_MARKS`)."""

from __future__ import annotations

import os

import pytest

from tests.real_sglang.lane import lane_missing


@pytest.fixture(autouse=True)
def _lane_built() -> None:
    missing = lane_missing()
    if missing is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {missing}", pytrace=False)
    pytest.skip(missing)
