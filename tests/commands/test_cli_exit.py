"""The CLI's way out: the process's own command line skips the exit-time collection (gc.freeze),
a caller that passes an argv keeps its collector as it was."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from supervisor.cli import main
from tests.preflight.support import SEED


def test_main_with_an_argv_leaves_the_callers_collector_alone(capsys):
    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit) as exc:
        main(["preflight", "--config", str(SEED)])
    assert exc.value.code == 1  # the seed launch does not fit
    assert "--hicache-size" in capsys.readouterr().out
    assert gc.get_freeze_count() == frozen


def test_the_process_entry_point_freezes_on_the_way_out():
    code = (
        "import gc, sys\n"
        "from supervisor.cli import main\n"
        f"sys.argv = ['sglang-supervisor', 'preflight', '--config', {str(SEED)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    print('EXIT', exc.code, gc.get_freeze_count() > 0)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.stdout.strip().splitlines()[-1] == "EXIT 1 True", done.stderr
