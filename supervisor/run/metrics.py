"""The metrics of one `run`: fed from the event tap, served on `[http] listen` and written to
`[metrics] textfile`, from before the first launch until the run ends.

A port already in use costs the listener, not the run: a warning names it and the run goes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import structlog

from supervisor import __version__
from supervisor.adapters.http_server import HttpListener
from supervisor.adapters.metrics import SupervisorMetrics, TextfileWriter
from supervisor.config import RunSettings
from supervisor.core.units import GB
from supervisor.log import add_sink, remove_sink

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


def _listen(metrics: SupervisorMetrics, address: tuple[str, int]) -> HttpListener | None:
    host, port = address
    listener = HttpListener(host, port)
    listener.route("/metrics", metrics.serve)
    try:
        bound_host, bound_port = listener.start()
    except OSError as exc:
        log.warning(
            "metrics_listen_failed",
            host=host,
            port=port,
            error=exc.strerror or str(exc),
            detail=f"no /metrics on port {port}; the run goes on",
        )
        return None
    log.info("http_listening", host=bound_host, port=bound_port, paths=["/metrics"])
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
def serve_metrics(settings: RunSettings) -> Iterator[SupervisorMetrics | None]:
    """The run's metrics while the block runs (None when neither listener nor textfile is on);
    at its end the listener is closed and the textfile written a last time."""
    address = settings.config.http.address
    path = textfile_path(settings)
    if address is None and path is None:
        yield None
        return
    metrics = SupervisorMetrics(settings.instance, __version__, _hicache_bytes(settings))
    add_sink(metrics)
    listener = _listen(metrics, address) if address is not None else None
    writer = _textfile(metrics, path) if path is not None else None
    try:
        yield metrics
    finally:
        remove_sink(metrics)
        if listener is not None:
            listener.close()
        if writer is not None:
            writer.close()
