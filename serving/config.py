"""The policy server's `user_config`: every knob, its default, its bound and its meaning, in one place.

serve_config.yaml sets only what differs from these defaults; app.py, policy.py and openapi.py read them here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

# Policy names appear in URLs and metric labels.
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)
# Frame-stacking session ids: any non-empty string up to this length.
SESSION_ID_MAX_LEN = 128
# dtypes a client may name in a base64-encoded array.
B64_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")


def _knob(default: Any, minimum: float | None, doc: str, maximum: float | None = None) -> Any:
    return field(default=default, metadata={"min": minimum, "max": maximum, "doc": doc})


@dataclass(frozen=True)
class ServingLimits:
    """Per-policy limits (applied when a policy loads)."""

    max_batch_items: int = _knob(1024, 1, "observations per act_batch request (413 above)")
    check_bounds: bool = _knob(True, None, "reject observations outside the observation space's low/high (422)")
    max_sessions: int = _knob(1024, 1, "frame-stacking sessions per policy and replica; least recently used evicted")
    session_ttl_s: float = _knob(600.0, 1, "idle frame-stacking sessions expire after this many seconds")


@dataclass(frozen=True)
class ServerKnobs:
    """Per-server settings."""

    max_batch_size: int = _knob(32, 1, "dynamic batching of concurrent single-observation requests; 1 turns it off")
    batch_wait_timeout_s: float = _knob(0.0, 0, "how long a batch waits to fill")
    max_body_bytes: int = _knob(1 << 20, 1024, "request body size (413 above)")
    body_timeout_s: float = _knob(30.0, 0.1, "seconds a request body may take to arrive after its headers (408 after)")


@dataclass(frozen=True)
class TransitionLogConfig:
    """`user_config.log`: transition logging to Parquet (serving/transitions.py). Off while `uri` is unset."""

    uri: str | None = _knob(None, None, "where the Parquet files go: a local path or a URI (s3://...); unset: off")
    sample_rate: float = _knob(1.0, 0, "share of sessions logged, whole sessions (by a hash of session_id)", 1)
    max_buffer: int = _knob(10000, 1, "rows held for the writer (an outage's unwritten rows included); more are "
                                      "dropped and counted")
    flush_rows: int = _knob(1000, 1, "a file is written as soon as this many rows wait")
    flush_interval_s: float = _knob(5.0, 0.05, "and at least this often while any row waits")
    retry_s: float = _knob(5.0, 0.05, "after a failed write, wait this long before trying the store again")

    @property
    def enabled(self) -> bool:
        return self.uri is not None


CANDIDATE_MODES = ("split", "shadow")
CANDIDATE_KEYS = ("checkpoint", "weight", "mode", "rollout")
POLICY_KEYS = ("checkpoint", "candidate")


@dataclass(frozen=True)
class CandidateSpec:
    """`policies.NAME.candidate`: a second checkpoint served under the same name next to the champion.

    split: `weight` is the share of new sessions (and of session-less requests) the candidate answers;
    shadow: the champion answers everything and `weight` is the share of its requests mirrored to the candidate.
    `rollout` is the rollout controller's persisted state: opaque here (a mapping), never a reason to reload."""

    checkpoint: str
    weight: float = 0.0
    mode: str = "split"
    rollout: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def shadow(self) -> bool:
        return self.mode == "shadow"

    def role_weight(self, role: str) -> float:
        """The configured share of a role: champion 1-w (split) or 1 (shadow), candidate w."""
        if role == "candidate":
            return self.weight
        return 1.0 if self.shadow else round(1.0 - self.weight, 12)


@dataclass(frozen=True)
class ServerConfig:
    """The deployment's `user_config`, validated. Unknown keys are an error so typos do not pass silently."""

    policies: dict[str, str]  # policy name -> the champion's checkpoint (local path, URI or registry ref)
    server: ServerKnobs = field(default_factory=ServerKnobs)
    limits: ServingLimits = field(default_factory=ServingLimits)
    candidates: dict[str, CandidateSpec] = field(default_factory=dict)  # policy name -> its candidate, if any
    log: TransitionLogConfig = field(default_factory=TransitionLogConfig)

    # `revision`: free-form and otherwise ignored; changing it makes Serve call reconfigure, which re-reads
    # checkpoints rewritten in place (same location, new checkpoint_id).
    EXTRA_KEYS = ("policies", "log", "revision")

    @classmethod
    def keys(cls) -> list[str]:
        return [*cls.EXTRA_KEYS[:1], *(f.name for f in fields(ServerKnobs)), *(f.name for f in fields(ServingLimits)),
                *cls.EXTRA_KEYS[1:]]

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> "ServerConfig":
        raw = dict(raw or {})
        unknown = sorted(set(raw) - set(cls.keys()))
        if unknown:
            raise ValueError(f"user_config: unknown keys {unknown}; known: {cls.keys()}")
        policies, candidates = _policies(raw.get("policies"))
        return cls(policies=policies, server=_knobs(ServerKnobs, raw), limits=_knobs(ServingLimits, raw),
                   candidates=candidates, log=_log(raw.get("log")))

    def __getattr__(self, name: str) -> Any:  # cfg.max_batch_size etc.: flat access to the knobs
        for part in (self.server, self.limits):
            if name in part.__dataclass_fields__:
                return getattr(part, name)
        raise AttributeError(name)


def _policies(pols: Any) -> tuple[dict[str, str], dict[str, CandidateSpec]]:
    if not isinstance(pols, Mapping) or not pols:
        raise ValueError("user_config.policies must map a policy name to {checkpoint: <path or URI>}")
    out: dict[str, str] = {}
    candidates: dict[str, CandidateSpec] = {}
    for name, spec in pols.items():
        if not _NAME_RE.match(str(name)):
            raise ValueError(f"user_config.policies: {name!r} is not a valid policy name ([A-Za-z0-9_.-], max 64)")
        if isinstance(spec, Mapping):
            unknown = sorted(set(map(str, spec)) - set(POLICY_KEYS))
            if unknown:
                raise ValueError(f"user_config.policies.{name}: unknown keys {unknown}; known: {list(POLICY_KEYS)}")
        ckpt = spec.get("checkpoint") if isinstance(spec, Mapping) else spec
        if not isinstance(ckpt, str) or not ckpt:
            raise ValueError(f"user_config.policies.{name}.checkpoint must be a path or URI string")
        out[str(name)] = ckpt
        cand = spec.get("candidate") if isinstance(spec, Mapping) else None
        if cand is not None:
            candidates[str(name)] = _candidate(f"user_config.policies.{name}.candidate", cand)
    return out, candidates


def _candidate(where: str, raw: Any) -> CandidateSpec:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping {{checkpoint, weight, mode, rollout}}, got {type(raw).__name__}")
    unknown = sorted(set(map(str, raw)) - set(CANDIDATE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {list(CANDIDATE_KEYS)}")
    ckpt = raw.get("checkpoint")
    if not isinstance(ckpt, str) or not ckpt:
        raise ValueError(f"{where}.checkpoint must be a path, URI or registry reference string")
    weight = raw.get("weight", 0.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
        raise ValueError(f"{where}.weight must be a number in [0, 1], got {weight!r}")
    mode = raw.get("mode", "split")
    if mode not in CANDIDATE_MODES:
        raise ValueError(f"{where}.mode must be one of {list(CANDIDATE_MODES)}, got {mode!r}")
    rollout = raw.get("rollout")
    if rollout is not None and not isinstance(rollout, Mapping):
        raise ValueError(f"{where}.rollout must be a mapping (the rollout controller's state), got {type(rollout).__name__}")
    return CandidateSpec(checkpoint=ckpt, weight=float(weight), mode=str(mode),
                         rollout=dict(rollout) if rollout is not None else None)


def _log(raw: Any) -> TransitionLogConfig:
    if raw is None:
        return TransitionLogConfig()
    where = "user_config.log"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping {{uri, sample_rate, max_buffer, ...}}, got {type(raw).__name__}")
    known = [f.name for f in fields(TransitionLogConfig)]
    unknown = sorted(set(map(str, raw)) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {known}")
    uri = raw.get("uri")
    if uri is not None and (not isinstance(uri, str) or not uri.strip()):
        raise ValueError(f"{where}.uri must be a local path or URI string (or unset: logging off), got {uri!r}")
    return _knobs(TransitionLogConfig, raw, where, skip=("uri",), uri=uri)


def _knobs(cls: type, raw: Mapping[str, Any], where: str = "user_config", skip: tuple[str, ...] = (),
           **given: Any) -> Any:
    values = dict(given)
    for f in fields(cls):
        if f.name in skip:
            continue
        v = raw.get(f.name, f.default)
        lo, hi = f.metadata["min"], f.metadata["max"]
        if f.type in ("bool", bool):
            if not isinstance(v, bool):
                raise ValueError(f"{where}.{f.name} must be true or false")
        else:
            typ = int if f.type in ("int", int) else float
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (typ is int and int(v) != v) or v < lo \
                    or (hi is not None and v > hi):
                bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise ValueError(f"{where}.{f.name} must be a {typ.__name__} {bound}, got {v!r}")
            v = typ(v)
        values[f.name] = v
    return cls(**values)
