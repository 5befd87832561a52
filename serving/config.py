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


def _knob(default: Any, minimum: float | None, doc: str) -> Any:
    return field(default=default, metadata={"min": minimum, "doc": doc})


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
class ServerConfig:
    """The deployment's `user_config`, validated. Unknown keys are an error so typos do not pass silently."""

    policies: dict[str, str]  # policy name -> checkpoint (local path or URI)
    server: ServerKnobs = field(default_factory=ServerKnobs)
    limits: ServingLimits = field(default_factory=ServingLimits)

    # `revision`: free-form and otherwise ignored; changing it makes Serve call reconfigure, which re-reads
    # checkpoints rewritten in place (same location, new checkpoint_id).
    EXTRA_KEYS = ("policies", "revision")

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
        return cls(policies=_policies(raw.get("policies")), server=_knobs(ServerKnobs, raw),
                   limits=_knobs(ServingLimits, raw))

    def __getattr__(self, name: str) -> Any:  # cfg.max_batch_size etc.: flat access to the knobs
        for part in (self.server, self.limits):
            if name in part.__dataclass_fields__:
                return getattr(part, name)
        raise AttributeError(name)


def _policies(pols: Any) -> dict[str, str]:
    if not isinstance(pols, Mapping) or not pols:
        raise ValueError("user_config.policies must map a policy name to {checkpoint: <path or URI>}")
    out: dict[str, str] = {}
    for name, spec in pols.items():
        if not _NAME_RE.match(str(name)):
            raise ValueError(f"user_config.policies: {name!r} is not a valid policy name ([A-Za-z0-9_.-], max 64)")
        ckpt = spec.get("checkpoint") if isinstance(spec, Mapping) else spec
        if not isinstance(ckpt, str) or not ckpt:
            raise ValueError(f"user_config.policies.{name}.checkpoint must be a path or URI string")
        out[str(name)] = ckpt
    return out


def _knobs(cls: type, raw: Mapping[str, Any]) -> Any:
    values = {}
    for f in fields(cls):
        v = raw.get(f.name, f.default)
        lo = f.metadata["min"]
        if f.type in ("bool", bool):
            if not isinstance(v, bool):
                raise ValueError(f"user_config.{f.name} must be true or false")
        else:
            typ = int if f.type in ("int", int) else float
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (typ is int and int(v) != v) or v < lo:
                raise ValueError(f"user_config.{f.name} must be a {typ.__name__} >= {lo}, got {v!r}")
            v = typ(v)
        values[f.name] = v
    return cls(**values)
