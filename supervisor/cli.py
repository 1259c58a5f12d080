"""The `sglang-supervisor` command group. Subcommands live in supervisor/commands/."""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys


def _hold_signals_for_run() -> None:
    """`sglang-supervisor run` started as a program: hold its signals pending from here until
    its handlers exist (commands/run.py), so a stop during start-up is queued, not fatal."""
    entry = os.path.basename(sys.argv[0]) if sys.argv else ""
    if sys.argv[1:2] == ["run"] and entry in ("sglang-supervisor", "__main__.py"):
        held = {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, held | {signal.SIGUSR1, signal.SIGUSR2})


_hold_signals_for_run()  # before the imports below: they are most of the start-up

import click  # noqa: E402

from supervisor import __version__  # noqa: E402
from supervisor.errors import ExitCode, SupervisorError  # noqa: E402

# Each command lives in its own module and is imported only when it runs (or for --help):
# `preflight` must start in well under a second and not pay for the runner's imports.
_COMMANDS: dict[str, tuple[str, str]] = {
    "preflight": ("supervisor.commands.preflight", "preflight"),
    "run": ("supervisor.commands.run", "run"),
    "demo": ("supervisor.commands.demo", "demo"),
    "reset-state": ("supervisor.commands.reset_state", "reset_state_command"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        command = getattr(importlib.import_module(target[0]), target[1])
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sglang-supervisor")
def cli() -> None:
    """Pre-flight, supervise and guard an SGLang server on a multi-GPU box."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI; operator errors print one line and exit with their code.

    `argv` None: this process's own command line, and the process ends here.
    """
    try:
        _main(argv)
    finally:
        if argv is None:
            # The interpreter's exit-time collection walks every object the imports made, about
            # 9 ms of a ~70 ms pre-flight; frozen objects are skipped and the OS frees them.
            # Called from Python with an argv (tests), the caller's collector is left alone.
            gc.freeze()


def _main(argv: list[str] | None) -> None:
    try:
        # Without standalone mode click returns ctx.exit(code) instead of exiting: pass it on.
        rc = cli.main(args=argv, prog_name="sglang-supervisor", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(ExitCode.BAD_INPUT)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SupervisorError as exc:
        _report(exc)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception:  # noqa: BLE001 - a bug: exit 70 (restarted), not Python's 1 (= no fit)
        import traceback  # only on this path: with linecache and tokenize, ~4 ms of start-up

        traceback.print_exc()
        click.echo("sglang-supervisor: internal error (a bug; traceback above)", err=True)
        sys.exit(ExitCode.INTERNAL)
    sys.exit(rc if isinstance(rc, int) else ExitCode.OK)


def _report(exc: SupervisorError) -> None:
    """The operator's one line on stderr; where the log is JSON, a `fatal` event instead (once),
    so that a program reading the log finds the reason as its last event."""
    log_module = sys.modules.get("supervisor.log")  # imported only by commands that log
    if log_module is None or log_module.configured_format() != "json":
        click.echo(f"sglang-supervisor: {exc}", err=True)
        return
    if not exc.logged:
        import structlog

        reason, *rest = str(exc).splitlines() or [""]
        extra = {"detail": "\n".join(rest)} if rest else {}
        log = structlog.get_logger("supervisor")
        log.error("fatal", exit_code=int(exc.exit_code), reason=reason, **extra)
