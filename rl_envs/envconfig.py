"""The one way an env's env_config mapping becomes its config dataclass (unknown keys named)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def config_of(cls: type[T], config: Mapping[str, Any] | None, env: str) -> T:
    config = dict(config or {})
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"{env} env: unknown env_config keys {unknown}; known: {known}")
    return cls(**config)
