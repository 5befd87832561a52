"""The figures a rollout is judged on, one representation for both sources (the server's stats endpoint and
Prometheus): a cumulative snapshot per version, and the window between two snapshots.

A `VersionFigures` holds cumulative counters (requests, errors, latency histogram buckets, ended episodes, the
running sums of episode returns and of their squares, shadow comparisons) and one gauge (open sticky sessions).
`window(now, since)` subtracts a baseline: the judge sees what happened since the rollout (returns) or the step
(errors, latency) started. A counter that went backwards (a replica restarted, its counters began again) raises
`CountersReset`: the window is unknown, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

ROLES = ("champion", "candidate")
SHADOW_KEYS = ("compared", "agreed", "dropped", "errors")


class CountersReset(Exception):
    """A cumulative figure is lower than its baseline."""


def _le(value: Any) -> float:
    return math.inf if str(value) in ("+Inf", "inf", "Inf") else float(value)


@dataclass(frozen=True)
class VersionFigures:
    requests: int = 0  # act / act_batch requests of this version, failed ones included
    errors: int = 0  # of which failed in this version
    latency_le: tuple[float, ...] = ()  # histogram upper bounds, the last one +inf
    latency_counts: tuple[float, ...] = ()  # cumulative counts per bound
    episodes: int = 0  # ended episodes attributed to this version
    return_sum: float = 0.0
    return_sq_sum: float = 0.0
    active_sessions: int | None = None  # a gauge; None when the source has no such figure
    shadow: dict[str, int] | None = None  # candidate in shadow mode: compared, agreed, dropped, errors
    checkpoint_id: str | None = None
    weight: float | None = None
    mode: str | None = None

    # ------------------------------------------------------------------ derived
    @property
    def latency_count(self) -> float:
        return self.latency_counts[-1] if self.latency_counts else 0

    @property
    def error_ratio(self) -> float | None:
        return self.errors / self.requests if self.requests > 0 else None

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.latency_le, self.latency_counts)

    @property
    def mean_return(self) -> float | None:
        return self.return_sum / self.episodes if self.episodes > 0 else None

    @property
    def std_return(self) -> float | None:
        """Sample standard deviation (ddof=1) from the sufficient statistics; 0 for one episode."""
        n = self.episodes
        if n < 1:
            return None
        if n == 1:
            return 0.0
        var = (self.return_sq_sum - self.return_sum ** 2 / n) / (n - 1)
        return math.sqrt(max(var, 0.0))  # rounding can make a constant sample's variance slightly negative

    @property
    def agreement(self) -> float | None:
        s = self.shadow or {}
        return s.get("agreed", 0) / s["compared"] if s.get("compared") else None

    # ------------------------------------------------------------------ arithmetic and JSON
    def minus(self, base: "VersionFigures") -> "VersionFigures":
        """The window since `base` (counters subtracted; gauges and identity from self)."""
        def sub(name: str, a: float, b: float) -> float:
            if a < b - 1e-9 * max(1.0, abs(b)):
                raise CountersReset(f"{name} went from {b:g} to {a:g}")
            return a - b

        le, counts = self.latency_le, self.latency_counts
        if base.latency_counts:
            if base.latency_le != le:
                if not le:
                    raise CountersReset("the latency histogram disappeared")
                raise CountersReset(f"latency buckets changed from {list(base.latency_le)} to {list(le)}")
            counts = tuple(sub("latency bucket", a, b) for a, b in zip(counts, base.latency_counts))
        shadow = self.shadow
        if shadow is not None and base.shadow:
            shadow = {k: int(sub(f"shadow {k}", shadow.get(k, 0), base.shadow.get(k, 0))) for k in SHADOW_KEYS}
        # Return sums are running totals that may decrease (negative rewards): only the episode count is checked.
        return VersionFigures(
            requests=int(sub("requests", self.requests, base.requests)),
            errors=int(sub("errors", self.errors, base.errors)),
            latency_le=le, latency_counts=counts,
            episodes=int(sub("episodes", self.episodes, base.episodes)),
            return_sum=self.return_sum - base.return_sum, return_sq_sum=self.return_sq_sum - base.return_sq_sum,
            active_sessions=self.active_sessions, shadow=shadow, checkpoint_id=self.checkpoint_id,
            weight=self.weight, mode=self.mode)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "latency_le":
                v = ["+Inf" if math.isinf(b) else b for b in v]
            elif f.name == "latency_counts":
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "VersionFigures":
        raw = dict(raw or {})
        names = {f.name for f in fields(cls)}
        raw = {k: v for k, v in raw.items() if k in names}
        raw["latency_le"] = tuple(_le(b) for b in raw.get("latency_le") or ())
        raw["latency_counts"] = tuple(raw.get("latency_counts") or ())
        return cls(**raw)


def histogram_quantile(q: float, le: tuple[float, ...], counts: tuple[float, ...]) -> float | None:
    """Prometheus's histogram_quantile on cumulative buckets: linear interpolation inside the bucket holding the
    rank; a rank in the +Inf bucket answers the highest finite bound. None for an empty histogram."""
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(le, counts):
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            start = prev_bound if prev_bound < bound else 0.0
            return start + (bound - start) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


@dataclass(frozen=True)
class Snapshot:
    """Cumulative figures of both versions at one time; `candidate` None when no candidate is served."""

    at: float
    champion: VersionFigures
    candidate: VersionFigures | None = None
    source: str = ""
    notes: tuple[str, ...] = field(default=())  # what the source could not provide (e.g. no sessions series)

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "source": self.source, "champion": self.champion.to_json(),
                "candidate": self.candidate.to_json() if self.candidate else None}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "Snapshot":
        cand = raw.get("candidate")
        return cls(at=float(raw.get("at", 0.0)), champion=VersionFigures.from_json(raw.get("champion") or {}),
                   candidate=VersionFigures.from_json(cand) if cand else None, source=str(raw.get("source", "")))


@dataclass(frozen=True)
class Window:
    """What happened between a baseline and now, per version (candidate zeros when it served nothing)."""

    champion: VersionFigures
    candidate: VersionFigures
    seconds: float


def window(now: Snapshot, since: Snapshot) -> Window:
    cand_now = now.candidate or VersionFigures()
    cand_base = since.candidate or VersionFigures()
    return Window(now.champion.minus(since.champion), cand_now.minus(cand_base), now.at - since.at)
