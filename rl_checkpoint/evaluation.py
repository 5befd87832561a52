"""Evaluation records: how good a checkpoint's greedy policy is, stored inside the checkpoint.

    <ckpt>/evaluations/<eval_id>.json     EvalRecord (versioned), one file per evaluation

A record is written once under a fresh, unique name and never rewritten: re-evaluating a checkpoint adds a record
and leaves the others alone (an object store PUT of a new key, or a local temp file + rename). Writers: `rl-eval`
(serving.evaluate) and the trainer. Readers: the registry and its promotion gate (rl_checkpoint.registry), the
policy server's `GET /v1/policies`, tests.

The figures are those of the *greedy* policy (explore=False: the action the server returns) over N episodes with a
95% bootstrap confidence interval of the mean, never the exploring policy's training return.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.storage import Storage, redact

EVAL_FORMAT_VERSION = 1
EVALUATIONS_DIR = "evaluations"
CI_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 10_000
CI_METHOD = f"percentile bootstrap of the mean, {BOOTSTRAP_RESAMPLES} resamples"


def bootstrap_ci(returns: Sequence[float], level: float = CI_LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean (seeded: the same returns give the same interval).

    One episode, or returns that are all equal, give the degenerate interval [mean, mean]."""
    import numpy as np
    from scipy import stats

    data = np.asarray(returns, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no returns to summarise")
    if data.size == 1 or np.all(data == data[0]):
        return float(data.mean()), float(data.mean())
    res = stats.bootstrap((data,), np.mean, confidence_level=level, n_resamples=BOOTSTRAP_RESAMPLES,
                          method="percentile", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def new_eval_id() -> str:
    """Sortable by time, unique across concurrent writers."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(4)


@dataclass(frozen=True)
class EvalRecord:
    """One greedy evaluation of one checkpoint."""

    eval_id: str
    checkpoint_id: str
    env: str | None
    returns: list[float]  # per episode, in seed order
    lengths: list[int]  # env steps per episode
    seeds: list[int | None]  # env reset seed per episode
    mean: float
    std: float
    min: float
    max: float
    ci95: list[float]  # [low, high] of the mean
    wall_s: float
    created: str
    env_config: dict[str, Any] = field(default_factory=dict)
    # Where the actions came from: "in_process" (the RLModule on Ray workers), "server" (through the HTTP API),
    # "training" (the trainer's evaluation).
    mode: str = "in_process"
    server: str | None = None  # the policy server's URL for mode=server
    policy: str | None = None  # the served policy name for mode=server
    checkpoint: str | None = None  # where the checkpoint was when evaluated (secrets redacted)
    max_episode_steps: int | None = None  # episodes cut at this many steps count as ended there
    greedy: bool = True
    ci_method: str = CI_METHOD
    format_version: int = EVAL_FORMAT_VERSION

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @classmethod
    def from_episodes(cls, *, checkpoint_id: str, env: str | None, returns: Sequence[float], lengths: Sequence[int],
                      seeds: Sequence[int | None], wall_s: float, **fields: Any) -> "EvalRecord":
        """Summary statistics computed here, once, from the per-episode figures."""
        import numpy as np

        if not returns:
            raise ValueError("an evaluation needs at least one episode")
        if not len(returns) == len(lengths) == len(seeds):
            raise ValueError("returns, lengths and seeds must have one entry per episode")
        data = np.asarray(returns, dtype=np.float64)
        lo, hi = bootstrap_ci(data)
        return cls(
            eval_id=new_eval_id(), checkpoint_id=checkpoint_id, env=env, returns=[float(r) for r in returns],
            lengths=[int(n) for n in lengths], seeds=[None if s is None else int(s) for s in seeds],
            mean=float(data.mean()), std=float(data.std(ddof=1)) if data.size > 1 else 0.0,
            min=float(data.min()), max=float(data.max()), ci95=[lo, hi], wall_s=round(float(wall_s), 3),
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **fields,
        )

    def summary(self) -> dict[str, Any]:
        """The short form a server, a registry listing or a log line shows."""
        return {"eval_id": self.eval_id, "episodes": self.episodes, "mean": round(self.mean, 3),
                "std": round(self.std, 3), "ci95": [round(x, 3) for x in self.ci95], "min": self.min, "max": self.max,
                "mode": self.mode, "created": self.created}

    def line(self) -> str:
        return (f"{self.checkpoint_id}: greedy return {self.mean:.2f} ± {self.std:.2f} over {self.episodes} episodes "
                f"(95% CI {self.ci95[0]:.2f}..{self.ci95[1]:.2f}, min {self.min:g}, max {self.max:g}, "
                f"mean length {sum(self.lengths) / len(self.lengths):.0f}) on {self.env} [{self.mode}] "
                f"in {self.wall_s:.1f}s")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["episodes"] = self.episodes
        return out

    @classmethod
    def from_json(cls, raw: Any, where: str) -> "EvalRecord":
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{where}: expected a JSON object")
        version = raw.get("format_version", EVAL_FORMAT_VERSION)
        if not isinstance(version, int) or version > EVAL_FORMAT_VERSION:
            raise CheckpointError(f"{where}: format_version {version!r} is newer than this code reads "
                                  f"({EVAL_FORMAT_VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in names}
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
                         and f.name not in values)
        if missing:
            raise CheckpointError(f"{where}: evaluation record lacks {missing}")
        rets = values["returns"]
        if not isinstance(rets, list) or not rets or not all(isinstance(r, (int, float)) and math.isfinite(r)
                                                             for r in rets):
            raise CheckpointError(f"{where}: 'returns' must be a non-empty list of finite numbers")
        ci = values["ci95"]
        if not isinstance(ci, list) or len(ci) != 2:
            raise CheckpointError(f"{where}: 'ci95' must be [low, high]")
        return cls(**values)


def write_eval_record(ckpt: Storage, record: EvalRecord) -> str:
    """Add `record` to the checkpoint at `ckpt` (a Storage rooted at the checkpoint); returns where it went.
    Never replaces a record: eval ids are unique, and an existing name is refused rather than overwritten."""
    rel = (EVALUATIONS_DIR, f"{record.eval_id}.json")
    if ckpt.exists(*rel):
        raise CheckpointError(f"evaluation record {redact(ckpt.uri(*rel))} already exists")
    try:
        ckpt.write_json(record.to_json(), *rel)
    except OSError as e:
        raise CheckpointError(f"cannot write the evaluation record to {redact(ckpt.uri(*rel))}: {e}") from None
    return ckpt.uri(*rel)


def read_eval_records(ckpt: Storage) -> list[EvalRecord]:
    """Every evaluation record of the checkpoint at `ckpt`, oldest first (empty when it was never evaluated)."""
    import pyarrow.fs as pafs

    if not ckpt.is_dir(EVALUATIONS_DIR):
        return []
    infos = ckpt.fs.get_file_info(pafs.FileSelector(ckpt.path(EVALUATIONS_DIR), allow_not_found=True))
    out = []
    for info in sorted(infos, key=lambda i: i.base_name):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        where = redact(ckpt.uri(EVALUATIONS_DIR, info.base_name))
        try:
            raw = ckpt.read_json(EVALUATIONS_DIR, info.base_name)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{where}: unreadable evaluation record ({e})") from None
        out.append(EvalRecord.from_json(raw, where))
    return out


def latest_eval(records: Sequence[EvalRecord], checkpoint_id: str | None = None) -> EvalRecord | None:
    """The newest record (of `checkpoint_id` when given: a checkpoint rewritten in place has a new id)."""
    chosen = [r for r in records if checkpoint_id is None or r.checkpoint_id == checkpoint_id]
    return max(chosen, key=lambda r: r.eval_id) if chosen else None
