"""`sglang-supervisor preflight`: does this launch fit the host? Table or JSON; exit 0/1/2."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from supervisor.config import NumaNodeSpec, SupervisorConfig, load_config
from supervisor.core.units import parse_size
from supervisor.errors import ConfigError, ExitCode


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Option callback: a size such as 445GB or 96GiB, parsed to bytes."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _gpu_list(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        out.extend(range(int(low), int(high) + 1) if dash else [int(low)])
    return tuple(out)


def parse_numa_spec(text: str) -> NumaNodeSpec:
    """`NODE:SIZE[:GPUS]`, e.g. `0:400GB:0-3` or `1:45GB:4,5,6,7`.

    Raises:
        ValueError: not of that form (the message shows an example).
    """
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{text!r} is not NODE:SIZE[:GPUS] (example: 1:200GB:4-7)")
    try:
        node = int(parts[0])
        gpus = _gpu_list(parts[2]) if len(parts) == 3 else ()
    except ValueError:
        raise ValueError(f"{text!r} is not NODE:SIZE[:GPUS] (example: 1:200GB:4-7)") from None
    return NumaNodeSpec(node=node, mem_available_bytes=parse_size(parts[1]), gpus=gpus)


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
@click.option("--gpu-memory", callback=_size, help="Memory of each GPU, e.g. 96GB.")
@click.option(
    "--numa",
    multiple=True,
    metavar="NODE:SIZE[:GPUS]",
    help="A NUMA node's free memory and its GPUs, e.g. 1:200GB:4-7 (repeat per node).",
)
@click.option(
    "--avg-request-tokens",
    type=click.IntRange(min=1),
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
    try:
        report = run_preflight(
            config,
            argv,
            gpu_sensor=sensor,
            config_dir=config_path.parent if config_path is not None else None,
        )
    finally:
        if sensor is not None:
            sensor.close()
    if print_args:
        if report.suggested_argv is None:
            click.echo("sglang-supervisor: no --hicache-size fits this host", err=True)
            return int(ExitCode.NO_FIT)
        click.echo(shlex.join(report.suggested_argv))
        return int(ExitCode.OK)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(report.render_table())
    return int(ExitCode.OK if report.fits else ExitCode.NO_FIT)
