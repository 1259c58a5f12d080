"""[hooks], [watchdog] shrink_expires and [run] restart_on_reload: parsing, defaults, and every
bad value refused naming its key (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import HooksConfig, load_config
from supervisor.errors import ConfigError, ExitCode


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_a_hook_is_a_shell_split_string_or_a_list_and_off_by_default(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            "[hooks]\n"
            "on_ready = \"/usr/bin/notify 'ready now' {instance}\"\n"
            'on_fatal = ["/usr/bin/page", "{kind} {incident_file}"]\n'
            'timeout = "3s"\n',
        )
    )
    assert config.hooks.on_ready == ("/usr/bin/notify", "ready now", "{instance}")
    assert config.hooks.on_fatal == ("/usr/bin/page", "{kind} {incident_file}")
    assert config.hooks.on_incident == ()
    assert config.hooks.timeout_s == 3.0
    assert HooksConfig() == load_config(None).hooks
    assert HooksConfig().commands() == {"on_incident": (), "on_fatal": (), "on_ready": ()}


def test_shrink_expires_and_restart_on_reload_default_off(tmp_path: Path) -> None:
    assert load_config(None).watchdog.shrink_expires_s == 0.0
    assert load_config(None).run.restart_on_reload is False
    config = load_config(
        write(tmp_path, '[watchdog]\nshrink_expires = "24h"\n[run]\nrestart_on_reload = true\n')
    )
    assert config.watchdog.shrink_expires_s == 86400.0
    assert config.run.restart_on_reload is True


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[hooks]\non_ready = "notify {instnace}"\n', "hooks.on_ready: '{instnace}': unknown"),
        ('[hooks]\non_fatal = ["page", "{kind"]\n', "hooks.on_fatal"),
        ('[hooks]\non_incident = "mail \\"unclosed"\n', "hooks.on_incident: No closing quotation"),
        ("[hooks]\non_ready = 3\n", "hooks.on_ready: expected a list of strings"),
        ('[hooks]\ntimeout = "0s"\n', "hooks.timeout must be positive"),
        ('[hooks]\ntimeout = "ten"\n', "hooks.timeout: not a duration"),
        ('[hooks]\non_start = "x"\n', "unknown config key hooks.on_start"),
        ('[watchdog]\nshrink_expires = "-1h"\n', "watchdog.shrink_expires"),
        ('[run]\nrestart_on_reload = "yes"\n', "run.restart_on_reload: expected true or false"),
    ],
)
def test_bad_values_are_refused_naming_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert fragment in str(caught.value)
    assert caught.value.exit_code is ExitCode.BAD_INPUT
