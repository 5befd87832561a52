"""Gauges that stay on Ray's metrics port for as long as their process lives.

Ray (2.58) exports a `ray.util.metrics.Gauge` series only in the report intervals in which it was set, and its
metrics agent drops a series it has not received for two report intervals (the gauge TTL of
ray/_private/telemetry/open_telemetry_metric_recorder.py). So a gauge set once (the checkpoint a policy serves) or
rarely (a Pong iteration's return, minutes apart) leaves Ray's metrics port ~20 s after it was set, and Prometheus,
dashboards and alerts see nothing (measured here with Ray's defaults: a gauge set once was gone 30 s later and never
came back, while a counter stayed). `KeptGauge` is a Gauge that remembers each series' last value; one daemon thread
per process sets them all again every half report interval, so the agent never lets them lapse.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any


def report_interval_s() -> float:
    """Ray's metrics report interval in this process (RAY_metrics_report_interval_ms; Ray floors it at 1 s)."""
    try:
        import ray

        ms = float(ray._config.metrics_report_interval_ms())
    except Exception:  # noqa: BLE001 - Ray's config not readable (no Ray here): its environment or default
        ms = float(os.environ.get("RAY_metrics_report_interval_ms") or 10_000)
    return max(ms, 1000.0) / 1000.0


class KeptGauge:
    """`ray.util.metrics.Gauge(name, description, tag_keys)` whose series are set again every half report interval
    with their last value (`set` as Ray's; a series set to 0 stays exported at 0)."""

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None):
        from ray.util import metrics as m

        self._gauge = m.Gauge(name, description, tag_keys=tag_keys)
        self._last: dict[tuple, tuple[float, dict[str, str]]] = {}
        self._lock = threading.Lock()
        _KEEPER.add(self)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        tags = dict(tags or {})
        with self._lock:  # held through Ray's set: a refresh never re-exports a value older than this one
            self._last[tuple(sorted(tags.items()))] = (value, tags)
            self._gauge.set(value, tags)

    def __getstate__(self) -> dict[str, Any]:  # a copy (pickled callbacks) is kept alive in its own process too
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        _KEEPER.add(self)

    def refresh(self) -> None:
        with self._lock:
            for value, tags in list(self._last.values()):
                self._gauge.set(value, tags)


class _Keeper:
    """The process's KeptGauges (weakly held) and the daemon thread that refreshes them."""

    def __init__(self) -> None:
        self._gauges: weakref.WeakSet[KeptGauge] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, gauge: KeptGauge) -> None:
        with self._lock:
            self._gauges.add(gauge)
            if self._thread is None or self._pid != os.getpid():  # a forked child has no thread of its own
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, args=(report_interval_s() / 2,),
                                                name="rl-metrics-keeper", daemon=True)
                self._thread.start()

    def _run(self, period_s: float) -> None:
        while True:
            time.sleep(period_s)
            with self._lock:
                gauges = list(self._gauges)
            for g in gauges:
                try:
                    g.refresh()
                except Exception:  # noqa: BLE001 - Ray shutting down under us: nothing left to export to
                    pass


_KEEPER = _Keeper()

__all__ = ["KeptGauge", "report_interval_s"]
