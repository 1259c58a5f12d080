"""The `sglang-supervisor` command group. Subcommands live in supervisor/commands/."""

from __future__ import annotations

import sys

import click

from supervisor import __version__
from supervisor.errors import ExitCode, SupervisorError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sglang-supervisor")
def cli() -> None:
    """Pre-flight, supervise and guard an SGLang server on a multi-GPU box."""


def _register() -> None:
    # Imported here so `sglang-supervisor --help` stays cheap and each command owns its module.
    from supervisor.commands import demo, preflight, reset_state, run

    cli.add_command(preflight.preflight)
    cli.add_command(run.run)
    cli.add_command(reset_state.reset_state_command)
    cli.add_command(demo.demo)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI; operator errors print one line and exit with their code."""
    _register()
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
        click.echo(f"sglang-supervisor: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(rc if isinstance(rc, int) else ExitCode.OK)
