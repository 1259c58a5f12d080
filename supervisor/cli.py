"""The `sglang-supervisor` command group. Subcommands live in supervisor/commands/."""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys
from typing import Any


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
from supervisor.core.bounded import clip_message  # noqa: E402
from supervisor.errors import ExitCode, SupervisorError  # noqa: E402

# Each command lives in its own module and is imported only when it runs (or for --help):
# `preflight` must start in well under a second and not pay for the runner's imports.
_COMMANDS: dict[str, tuple[str, str]] = {
    "preflight": ("supervisor.commands.preflight", "preflight"),
    "run": ("supervisor.commands.run", "run"),
    "demo": ("supervisor.commands.demo", "demo"),
    "reset-state": ("supervisor.commands.reset_state", "reset_state_command"),
    "check-config": ("supervisor.commands.check_config", "check_config"),
    "status": ("supervisor.commands.status", "status_command"),
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
        _json_error(clip_message(exc.format_message()), exc.exit_code, argv)
        if not _report_usage(exc, argv):
            exc.show()
        sys.exit(exc.exit_code)
    except SupervisorError as exc:
        message = clip_message(str(exc))
        _json_error(message, exc.exit_code, argv)
        _report(exc, message)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception:  # a bug: exit 70 (restarted), not Python's 1 (= no fit)
        _json_error("internal error (a bug: the traceback is on stderr)", ExitCode.INTERNAL, argv)
        log = _structured_log()
        if log is not None:  # the traceback as the event's `exception`
            log.exception("fatal", exit_code=int(ExitCode.INTERNAL), reason="internal error")
            sys.exit(ExitCode.INTERNAL)
        import traceback  # only on this path: with linecache and tokenize, ~4 ms of start-up

        traceback.print_exc()
        click.echo("sglang-supervisor: internal error (a bug; traceback above)", err=True)
        sys.exit(ExitCode.INTERNAL)
    sys.exit(rc if isinstance(rc, int) else ExitCode.OK)


def _structured_log() -> Any:
    """The logger when the log is structured (JSON or journal lines), else None: then every
    line on stderr must be an event, and a plain line would break the programs reading it."""
    log_module = sys.modules.get("supervisor.log")  # imported only by commands that log
    if log_module is None or not log_module.is_structured():
        return None
    import structlog

    return structlog.get_logger("supervisor")


def _report(exc: SupervisorError, message: str) -> None:
    """The operator's one line on stderr; where the log is structured, a `fatal` event instead
    (once), so that a program reading the log finds the reason as its last event. `message` is
    the error's, each line clipped (a value it quotes may be megabytes long)."""
    log = _structured_log()
    if log is None:
        click.echo(f"sglang-supervisor: {message}", err=True)
        return
    if not exc.logged:
        reason, *rest = message.splitlines() or [""]
        extra = {"detail": "\n".join(rest)} if rest and not exc.detail_logged else {}
        log.error("fatal", exit_code=int(exc.exit_code), reason=reason, **extra)


# The commands whose --json prints their answer as one JSON object on stdout: their errors too.
_JSON_COMMANDS = frozenset({"preflight", "check-config", "status"})


def _json_error(message: str, exit_code: int, argv: list[str] | None) -> None:
    """With --json, the error as a JSON object on stdout, where the program that asked for JSON
    reads; the human line still goes to stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    own = args[: args.index("--")] if "--" in args else args
    if args[:1] and args[0] in _JSON_COMMANDS and "--json" in own:
        import json

        reason, *rest = message.splitlines() or [""]
        error = {"ok": False, "exit_code": int(exit_code), "error": reason}
        if rest:
            error["detail"] = "\n".join(rest)
        click.echo(json.dumps(error))


def _report_usage(exc: click.ClickException, argv: list[str] | None) -> bool:
    """A usage error of `run` as a `fatal` event, where its log would be structured (its
    --log-format, else auto); False: not `run`'s, or not structured, and shown as text."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["run"]:
        return False
    from supervisor import log as log_module

    own = args[1 : args.index("--")] if "--" in args else args[1:]
    fmt = os.environ.get("SGLANG_SUPERVISOR_LOG_FORMAT", "auto")
    for i, arg in enumerate(own):
        if arg == "--log-format" and i + 1 < len(own):
            fmt = own[i + 1]
        elif arg.startswith("--log-format="):
            fmt = arg.partition("=")[2]
    log_module.configure_logging(fmt if fmt in log_module.FORMATS else "auto")
    log = _structured_log()
    if log is None:
        return False
    log.error("fatal", exit_code=exc.exit_code, reason=exc.format_message())
    return True
