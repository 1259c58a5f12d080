"""`sglang-supervisor preflight`: does this launch fit the host? Table or JSON; exit 0/1/2."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from supervisor.config import NumaNodeSpec, SupervisorConfig, load_config
from supervisor.config.sections import MIN_GPU_MEMORY_BYTES
from supervisor.core.units import parse_size
from supervisor.errors import ConfigError, ExitCode

if TYPE_CHECKING:  # a type only: the report's module loads with the pre-flight, when it runs
    from supervisor.adapters.ledger import Ledger
    from supervisor.core.checks import FitReport


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Option callback: a size such as 445GB or 96GiB, parsed to bytes."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _gpu_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Option callback: one GPU's memory; below 1 GiB it is a typo (or a bare 0), not a GPU."""
    size = _size(ctx, param, value)
    if size is not None and size < MIN_GPU_MEMORY_BYTES:
        raise click.BadParameter(
            f"must be at least 1 GiB, the memory of one GPU (got {value!r})", ctx=ctx, param=param
        )
    return size


class _BackwardRange(ValueError):
    pass


def _gpu_list(text: str) -> tuple[int, ...]:
    """`0-3`, `4,5,6,7`: GPU indexes. Raises ValueError on anything else."""
    out: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if dash and int(high) < int(low):  # range() would give no GPU at all, silently
            raise _BackwardRange(f"the GPU range {part} runs backwards")
        out.extend(range(int(low), int(high) + 1) if dash else [int(low)])
    return tuple(out)


def parse_numa_spec(text: str) -> NumaNodeSpec:
    """`NODE:SIZE[:GPUS]`, e.g. `0:400GB:0-3` or `1:45GB:4,5,6,7`.

    Raises:
        ValueError: not of that form (the message shows an example).
    """
    parts = text.split(":")
    form = f"{text!r} is not NODE:SIZE[:GPUS] (example: 1:200GB:4-7)"
    if len(parts) not in (2, 3):
        raise ValueError(form)
    try:
        node = int(parts[0])
        gpus = _gpu_list(parts[2]) if len(parts) == 3 else ()
    except _BackwardRange as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    except ValueError:
        raise ValueError(form) from None
    try:
        size = parse_size(parts[1])
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    return NumaNodeSpec(node=node, mem_available_bytes=size, gpus=gpus)


def _apply_options(config: SupervisorConfig, opts: Mapping[str, object]) -> SupervisorConfig:
    """Command-line facts win over the config file (precedence: CLI > file > defaults)."""
    host_fields: dict[str, Any] = {
        "mem_available_bytes": opts["mem_available"],
        "cgroup_headroom_bytes": opts["cgroup_headroom"],
        "gpus": opts["gpus"],
        "gpu_memory_bytes": opts["gpu_memory"],
        "sglang_version": opts["sglang_version"],
    }
    numa = opts["numa"]
    if isinstance(numa, tuple) and numa:
        try:
            host_fields["numa"] = tuple(parse_numa_spec(str(s)) for s in numa)
        except ValueError as exc:
            raise ConfigError(f"--numa {exc}") from None
    host = dataclasses.replace(
        config.host, **{k: v for k, v in host_fields.items() if v is not None and v != ()}
    )
    pre_fields: dict[str, Any] = {
        "avg_request_tokens": opts["avg_request_tokens"],
        "weights_bytes": opts["weights"],
    }
    pre = dataclasses.replace(
        config.preflight, **{k: v for k, v in pre_fields.items() if v is not None}
    )
    server = config.server
    if opts["model_config"] is not None:
        server = dataclasses.replace(server, model_config=str(opts["model_config"]))
    gpu = config.gpu
    if opts["gpu_backend"] is not None:
        gpu = dataclasses.replace(gpu, backend=str(opts["gpu_backend"]))
    return dataclasses.replace(config, host=host, preflight=pre, server=server, gpu=gpu)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="TOML config file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--print-args",
    is_flag=True,
    help="Print the launch_server argv with the safe --hicache-size substituted.",
)
@click.option("--mem-available", callback=_size, help="Host MemAvailable to plan for, e.g. 445GB.")
@click.option("--cgroup-headroom", callback=_size, help="cgroup memory headroom to plan for.")
@click.option("--gpus", type=click.IntRange(min=1), help="Number of GPUs to plan for.")
@click.option("--gpu-memory", callback=_gpu_size, help="Memory of each GPU, e.g. 96GB.")
@click.option(
    "--numa",
    multiple=True,
    metavar="NODE:SIZE[:GPUS]",
    help="A NUMA node's free memory and its GPUs, e.g. 1:200GB:4-7 (repeat per node).",
)
@click.option(
    "--avg-request-tokens",
    type=click.IntRange(min=1, max=10**8),
    help="Tokens per request for the 'what it buys' line (default 4096).",
)
@click.option("--model-config", type=click.Path(path_type=Path), help="config.json to use.")
@click.option("--weights", callback=_size, help="Checkpoint size when the shards are elsewhere.")
@click.option(
    "--gpu-backend",
    type=click.Choice(["auto", "nvml", "sim", "none"]),
    help="How to read the GPUs (default: [gpu] backend, auto).",
)
@click.option("--sglang-version", help="SGLang version whose rules apply (default: installed).")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def preflight(
    config_path: Path | None,
    as_json: bool,
    print_args: bool,
    server_args: tuple[str, ...],
    **opts: object,
) -> int:
    """Check that an SGLang launch fits the host before starting it.

    \b
    sglang-supervisor preflight [OPTIONS] -- <launch_server args>
    sglang-supervisor preflight --config FILE
    Exit codes: 0 fits, 1 does not fit, 2 bad input.
    """
    from supervisor.preflight import run_preflight
    from supervisor.preflight.sensors import LazySensor

    config = _apply_options(load_config(config_path), opts)
    argv = server_args or config.server.args
    if not argv:
        raise ConfigError(
            "no launch_server arguments: give them after -- or as [server] args in --config"
        )
    sensor = None if config.gpu.backend == "none" else LazySensor(config.gpu.backend)
    book = _ledger(config)
    try:
        report = run_preflight(
            config,
            argv,
            gpu_sensor=sensor,
            config_dir=config_path.parent if config_path is not None else None,
            reserved=book.others() if book is not None else (),
        )
    finally:
        if sensor is not None:
            sensor.close()
    if print_args:
        return print_launch_line(report, argv)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(report.render_table())
    return int(ExitCode.OK if report.fits else ExitCode.NO_FIT)


def _ledger(config: SupervisorConfig) -> Ledger | None:
    """The host ledger when this pre-flight reads it; imported only then (a planning pre-flight,
    of another box, never does, and it is a few ms of the cold start)."""
    planning = config.host.mem_available_bytes is not None
    if planning or not config.preflight.ledger_dir:
        return None
    from supervisor.adapters.ledger import open_ledger

    return open_ledger(config.preflight.ledger_dir, config.run.name, planning=planning)


def secret_variable(flag: str) -> str:
    """Where --print-args tells the shell to take a secret flag's value from: printing it would
    leak it, printing *** would launch with the key "***". A plain shell variable of the
    operator's named after the flag (SGLang reads no environment variable for its keys):
    --api-key "$API_KEY", --ssl-keyfile-password "$SSL_KEYFILE_PASSWORD"."""
    return flag.removeprefix("--").upper().replace("-", "_")


def print_launch_line(report: FitReport, argv: tuple[str, ...]) -> int:
    """`--print-args`: the argv that fits as one shell line, secrets as "$VARIABLE"s; the
    exit code says whether there was one (0) or not (1)."""
    from supervisor.preflight.plan import launch_argv

    hicache = report.hicache_mode != "off"
    fitting = launch_argv(
        argv,
        report.max_hicache_size_gb,
        uses_hicache=hicache,
        fits_without_hicache=report.fits_without_hicache,
    )
    if fitting is None:
        why = "no --hicache-size fits this host" if hicache else "HiCache is off, and"
        if not report.fits_without_hicache:
            why += ("; " if hicache else " ") + "the launch does not fit even without HiCache"
        click.echo(f"sglang-supervisor: {why}", err=True)
        return int(ExitCode.NO_FIT)
    line, names = shell_line(fitting)
    click.echo(line)
    if not hicache:
        click.echo(
            "sglang-supervisor: HiCache is off (no --enable-hierarchical-cache): the argv is "
            "printed unchanged, --hicache-size would be ignored",
            err=True,
        )
    if names:
        click.echo(
            f"sglang-supervisor: export {' and '.join(names)} before running this line "
            "(the line takes the API keys from these shell variables)",
            err=True,
        )
    return int(ExitCode.OK)


def shell_line(argv: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(argv quoted for a POSIX shell with each secret value as "$VARIABLE", those variables)."""
    from supervisor.core.sglang_args import secret_flag_names
    from supervisor.core.sglang_cli import option_spans
    from supervisor.core.sglang_flags import is_secret_flag
    from supervisor.core.sglang_versions import rules_for_version

    table = rules_for_version(None).cli().table
    words = [shlex.quote(token) for token in argv]
    used: list[str] = []

    def reference(flag: str) -> str:
        variable = secret_variable(flag)
        if variable not in used:
            used.append(variable)
        return f'"${variable}"'

    for index, flag, token, values in option_spans(argv, table):
        if not is_secret_flag(flag):
            continue
        if "=" in token:
            words[index] = f"{token.partition('=')[0]}={reference(flag.names[0])}"
        for i in values:
            words[i] = reference(flag.names[0])
    # The exact spellings anywhere, as redact_argv catches them (e.g. after a stray "--").
    names = secret_flag_names(table)
    for i, token in enumerate(argv):
        name, eq, _value = token.partition("=")
        if token in names and i + 1 < len(argv):
            words[i + 1] = reference(token)
        elif eq and name in names:
            words[i] = f"{name}={reference(name)}"
    return " ".join(words), tuple(used)
