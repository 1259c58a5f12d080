"""Prometheus metrics from the log events: a sink for the event tap, the registry it updates,
the `/metrics` route, and the node_exporter textfile writer.

Which event changes which metric is decided in supervisor/core/metrics_map.py; this module only
applies the updates with prometheus-client, on a registry of its own (not the global one).
Every metric carries `name` (the instance), so two supervisors' textfiles on one host never
collide.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.registry import Collector

from supervisor.adapters.http_server import Request, Response
from supervisor.atomic_file import write_text_atomic
from supervisor.core.metrics_map import PREFIX, SPECS, EventMapper, Kind, MetricSpec, Op, Update

# The textfile is rewritten at most this often (node_exporter reads it at each scrape).
TEXTFILE_INTERVAL_S = 5.0
# node_exporter reads the textfile as its own (unprivileged) user; the metrics hold no secret.
TEXTFILE_MODE = 0o644


def _labels(spec: MetricSpec) -> list[str]:
    return ["name"] if spec.label is None else ["name", *spec.label.split(",")]


def _values_of(instance: str, label: str | None) -> list[str]:
    return [instance] if label is None else [instance, *label.split(",")]


class _Gauges(Collector):
    """Gauges that may be unknown: a value no longer known (no server, no budget) is left out
    of the exposition instead of reading as 0."""

    def __init__(self, specs: Sequence[MetricSpec], instance: str) -> None:
        self._specs = specs
        self._instance = instance
        self._values: dict[tuple[str, str | None], float] = {}
        self._lock = threading.Lock()
        # Unlabelled gauges read at each collection; None from a reader keeps the event's value.
        self.live: dict[str, Callable[[], float | None]] = {}

    def apply(self, update: Update) -> None:
        key = (update.metric, update.label)
        with self._lock:
            if update.op is Op.UNSET:
                self._values.pop(key, None)
            else:
                self._values[key] = update.value

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            values = dict(self._values)
        for name, read in self.live.items():
            value = read()
            if value is not None:
                values[(name, None)] = value
        for spec in self._specs:
            family = GaugeMetricFamily(PREFIX + spec.name, spec.help, labels=_labels(spec))
            for (metric, label), value in values.items():
                if metric == spec.name:
                    family.add_metric(_values_of(self._instance, label), value)
            yield family


class SupervisorMetrics:
    """The registry, fed by `__call__` (a log sink: quick, thread-safe, never logs)."""

    def __init__(
        self,
        instance: str,
        version: str,
        hicache_bytes: Callable[[Sequence[str]], int | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        # `_created` series double every counter and histogram for a value no dashboard uses
        # (a process-wide switch: this registry is the supervisor's only one).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self._instance = instance
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._mapper = EventMapper(hicache_bytes)
        self._gauges = _Gauges([s for s in SPECS if s.kind is Kind.GAUGE], instance)
        self.registry.register(self._gauges)
        self._counters = {
            s.name: Counter(PREFIX + s.name, s.help, _labels(s), registry=self.registry)
            for s in SPECS
            if s.kind is Kind.COUNTER
        }
        self._histograms = {
            s.name: Histogram(
                PREFIX + s.name, s.help, _labels(s), registry=self.registry, buckets=s.buckets
            )
            for s in SPECS
            if s.kind is Kind.HISTOGRAM
        }
        for spec in SPECS:  # known label values are exported at 0 from the start
            metric = self._counters.get(spec.name) or self._histograms.get(spec.name)
            if metric is None:
                continue
            for value in spec.initial if spec.label is not None else (None,):
                metric.labels(*self._label_values(value))
        self._listeners: list[Callable[[], None]] = []
        self._apply(self._mapper.initial(version))

    def _label_values(self, label: str | None) -> list[str]:
        return _values_of(self._instance, label)

    def live_gauge(self, name: str, read: Callable[[], float | None]) -> None:
        """Gauge `name` is read by `read` at each collection (a scrape, a textfile write),
        falling back to what the events last set when it gives None."""
        self._gauges.live[name] = read

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (quick, never logging) after every event that changed a metric."""
        self._listeners.append(listener)

    def __call__(self, event: Mapping[str, Any]) -> None:
        with self._lock:
            updates = self._mapper.feed(event, mono_s=self._clock(), wall_s=self._wall())
            self._apply(updates)
        if updates:
            for listener in self._listeners:
                listener()

    def _apply(self, updates: Iterable[Update]) -> None:
        for update in updates:
            labels = self._label_values(update.label)
            if update.metric in self._counters:
                self._counters[update.metric].labels(*labels).inc(update.value)
            elif update.metric in self._histograms:
                self._histograms[update.metric].labels(*labels).observe(update.value)
            else:
                self._gauges.apply(update)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry as the client asked (text format, or OpenMetrics), and its type."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def serve(self, request: Request) -> Response:
        """The `/metrics` route."""
        body, content_type = self.exposition(request.headers.get("accept", ""))
        return Response(200, body, content_type)


class TextfileWriter:
    """Writes the registry to `path` for node_exporter's textfile collector: at once after a
    change, at most every `interval_s`, and at close. Each write is atomic (a temporary file
    beside it, renamed over it), so the collector never reads half a file.

    Through supervisor/atomic_file.py, not prometheus_client's write_to_textfile: that one opens
    a predictable temp name (`<path>.<pid>.<thread id>`) with a plain open, so a link planted
    there in the collector's directory made root overwrite the link's target. Ours is created
    with O_EXCL under a random name ending in .tmp (the collector reads *.prom only), then
    renamed over `path`, which replaces a link there rather than writing through it."""

    def __init__(
        self,
        registry: CollectorRegistry,
        path: str | Path,
        *,
        interval_s: float = TEXTFILE_INTERVAL_S,
        on_error: Callable[[OSError], None] = lambda _exc: None,
        on_recovered: Callable[[], None] = lambda: None,
    ) -> None:
        self.registry = registry
        self.path = Path(path)
        self.interval_s = interval_s
        self._on_error = on_error
        self._on_recovered = on_recovered
        self._failing = False
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-textfile", daemon=True)

    def start(self) -> None:
        self._dirty.set()  # the first write at once: the file exists from the start
        self._thread.start()

    def changed(self) -> None:
        self._dirty.set()

    def close(self) -> None:
        """Stop the thread and write the final values."""
        self._stop.set()
        self._dirty.set()
        if self._thread.is_alive():
            self._thread.join(10.0)
        self.write()

    def write(self) -> bool:
        """One write now; errors go to on_error once per run of failures."""
        try:
            text = generate_latest(self.registry).decode("utf-8")
            write_text_atomic(self.path, text, mode=TEXTFILE_MODE)
        except OSError as exc:
            if not self._failing:
                self._failing = True
                self._on_error(exc)
            return False
        if self._failing:
            self._failing = False
            self._on_recovered()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            self.write()
            self._stop.wait(self.interval_s)
