"""`run` refuses a metrics setup that cannot be right before anything starts: exit 2, the key
named, no traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import structlog

from supervisor.cli import main

FAKE = f"{sys.executable} -m supervisor.testing.fake_sglang"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            '[http]\nlisten = "0.0.0.0:9400"\n',
            "config key http.listen: 0.0.0.0 is not a loopback address; serving beyond this "
            "host needs http.allow_remote = true",
        ),
        ('[http]\nlisten = "[::]:9400"\n', "http.allow_remote = true"),
        ('[http]\nlisten = "localhost"\n', "config key http.listen: 'localhost' is not HOST:PORT"),
        ('[metrics]\ntextfile = "/tmp/x.txt"\n', "config key metrics.textfile must end in .prom"),
        (
            '[metrics]\ntextfile = "/nonexistent/collector/x.prom"\n',
            "config key metrics.textfile: /nonexistent/collector is not a directory",
        ),
    ],
)
def test_a_metrics_setup_that_cannot_work_exits_2_naming_the_key(tmp_path, capsys, config, message):
    path = tmp_path / "run.toml"
    path.write_text(config)
    argv = ["run", "--config", str(path), "--state-dir", str(tmp_path / "state")]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--server-command", FAKE, "--", "--model-path", "m"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "state" / "state.json").exists()  # refused before anything started
