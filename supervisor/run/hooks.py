"""The `[hooks]` of one `run`: the hook runner (adapters/hooks.py) on the log tap, so that every
`ready`, `fatal` and `incident_written` event calls its hook whichever thread logged it.
"""

from __future__ import annotations

from supervisor.adapters.command import CommandRunner
from supervisor.adapters.hooks import HookRunner
from supervisor.config import RunSettings
from supervisor.log import add_sink, remove_sink


class NotificationHooks:
    """Started on the tap at construction; `close` waits for the hooks already called.
    `launcher` runs each hook contained (adapters/command.py; default: /proc mode)."""

    def __init__(self, settings: RunSettings, launcher: CommandRunner | None = None) -> None:
        hooks = settings.config.hooks
        self.runner = HookRunner(
            hooks.commands(),
            instance=settings.instance,
            timeout_s=hooks.timeout_s,
            launcher=launcher,
        )
        add_sink(self.runner.sink)

    def reload(self, settings: RunSettings) -> None:
        """A reload hook (Plugins.reload_hooks): the new commands apply from the next event."""
        hooks = settings.config.hooks
        self.runner.configure(hooks.commands(), hooks.timeout_s)

    def close(self) -> None:
        remove_sink(self.runner.sink)
        self.runner.close()
