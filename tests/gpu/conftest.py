"""Real NVML for the `gpu` tests: started per test, or the test skips where NVML does not start
(no driver, no GPU), as on every machine without one."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pynvml
import pytest


@pytest.fixture
def nvml() -> Iterator[ModuleType]:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"NVML does not start here: {exc}")
    yield pynvml
    pynvml.nvmlShutdown()
