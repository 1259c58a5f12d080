"""The metrics of one `run`: fed from the event tap, served on `[http] listen` and written to
`[metrics] textfile`, from before the first launch until the run ends; beside them on the same
listener the probes /healthz and /readyz, and on a group's leader the group's endpoints.

A port already in use costs the listener, not the run: a warning names it and the run goes on.
In group mode the listener is always on (`$POD_IP:9400` when `[http] listen` is empty) and a
port it cannot bind ends the run (exit 2): the group's decision and the probes live there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import structlog

from supervisor import __version__
from supervisor.adapters.http_server import HttpListener
from supervisor.adapters.live_reading import LIVE_WAIT_S, LiveReading, tree_memory_source
from supervisor.adapters.metrics import SupervisorMetrics, TextfileWriter
from supervisor.config import RunSettings
from supervisor.core.ports import ServerHandle
from supervisor.core.units import GB
from supervisor.errors import ConfigError
from supervisor.group.board import REPORT_PATH, STATUS_PATH, GroupBoard
from supervisor.group.health import NodeProbes
from supervisor.group.setup import listen_address
from supervisor.log import add_sink, remove_sink
from supervisor.run.plugins import Component, ComponentFactory, Plugins

log = structlog.get_logger("supervisor.metrics")


def textfile_path(settings: RunSettings) -> Path | None:
    """`[metrics] textfile`, relative to the config file's directory; None when not set."""
    text = settings.config.metrics.textfile
    if not text:
        return None
    path = Path(text)
    if not path.is_absolute() and settings.config_dir is not None:
        path = settings.config_dir / path
    return path


def metrics_problem(settings: RunSettings) -> str | None:
    """Why the metrics cannot be set up as configured (said before anything starts), or None."""
    path = textfile_path(settings)
    if path is not None and not path.parent.is_dir():
        return f"config key metrics.textfile: {path.parent} is not a directory"
    return None


def _hicache_bytes(settings: RunSettings) -> Callable[[Sequence[str]], int | None]:
    """A launch argv's --hicache-size in bytes per rank, read by the rules of the SGLang that
    runs it (abbreviations, `--config` YAML): 0 without HiCache, None when SGLang sizes it."""

    def size(argv: Sequence[str]) -> int | None:
        try:
            plan = settings.reader.plan(tuple(argv))
        except Exception:  # noqa: BLE001 - a sink must not fail: the size is then unknown
            return None
        if not plan.uses_hicache:
            return 0
        return plan.hicache_size_gb * GB if plan.hicache_size_gb > 0 else None

    return size


def _listen(
    settings: RunSettings,
    address: tuple[str, int],
    metrics: SupervisorMetrics,
    probes: NodeProbes,
    board: GroupBoard | None,
) -> HttpListener | None:
    host, port = address
    listener = HttpListener(host, port)
    listener.route("/metrics", metrics.serve)
    probes.serve_on(listener)
    if board is not None:
        board.serve_on(listener)
    try:
        bound_host, bound_port = listener.start()
    except OSError as exc:
        error = exc.strerror or str(exc)
        if settings.group is not None:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({error}): group mode needs the supervisor's "
                "listener for the group's decision and the probes ([http] listen)"
            ) from None
        log.warning(
            "metrics_listen_failed",
            host=host,
            port=port,
            error=error,
            detail=f"no /metrics on port {port}; the run goes on",
        )
        return None
    paths = ["/metrics", "/healthz", "/readyz"]
    paths += [REPORT_PATH, STATUS_PATH] if board is not None else []
    log.info("http_listening", host=bound_host, port=bound_port, paths=paths)
    return listener


def _textfile(metrics: SupervisorMetrics, path: Path) -> TextfileWriter:
    writer = TextfileWriter(
        metrics.registry,
        str(path),
        on_error=lambda exc: log.warning(
            "metrics_textfile_failed", path=str(path), error=exc.strerror or str(exc)
        ),
        on_recovered=lambda: log.info("metrics_textfile_written_again", path=str(path)),
    )
    metrics.on_change(writer.changed)
    writer.start()
    return writer


@contextlib.contextmanager
def serve_metrics(
    settings: RunSettings, board: GroupBoard | None = None
) -> Iterator[SupervisorMetrics | None]:
    """The run's metrics while the block runs (None when neither listener nor textfile is on);
    at its end the listener is closed and the textfile written a last time. `board`: the
    group's endpoints, on a group's leader.

    Raises:
        ConfigError: group mode, and the listener cannot bind.
    """
    address = listen_address(settings.config.http, settings.group, os.environ)
    path = textfile_path(settings)
    if address is None and path is None:
        yield None
        return
    metrics = SupervisorMetrics(settings.instance, __version__, _hicache_bytes(settings))
    probes = NodeProbes(group=settings.group is not None)
    add_sink(metrics)
    add_sink(probes)
    listener: HttpListener | None = None
    writer: TextfileWriter | None = None
    try:
        if address is not None:
            listener = _listen(settings, address, metrics, probes, board)
        writer = _textfile(metrics, path) if path is not None else None
        yield metrics
    finally:
        remove_sink(probes)
        remove_sink(metrics)
        if listener is not None:
            listener.close()
        if writer is not None:
            writer.close()


class _LiveTree:
    """While a server runs, the `tree_memory_bytes` gauge is read from its tree at each scrape."""

    def __init__(self, reading: LiveReading, source: Callable[[], int | None]) -> None:
        self.reading, self.source = reading, source

    def start(self) -> None:
        self.reading.set_source(self.source)

    def stop(self, timeout_s: float = 0.0) -> None:
        self.reading.set_source(None)


def tree_memory_plugins(metrics: SupervisorMetrics | None, wait_s: float = LIVE_WAIT_S) -> Plugins:
    """The component that makes the tree's memory in the metrics a reading taken at the scrape,
    not the watchdog's last report (none without metrics)."""
    if metrics is None:
        return Plugins()
    reading = LiveReading(wait_s)
    metrics.live_gauge("tree_memory_bytes", reading.read)

    def live_tree(server: ServerHandle, _post: object, _info: object) -> Component:
        return _LiveTree(reading, tree_memory_source(server))

    factory: ComponentFactory = live_tree
    return Plugins(components=(factory,))
