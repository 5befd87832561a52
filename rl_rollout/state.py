"""The rollout's desired state, kept in the Serve config itself (never only in the controller):

    user_config.policies.NAME:
      checkpoint: <champion>
      candidate:
        checkpoint: <candidate>
        weight: 0.05            # the current step's share
        mode: split | shadow
        rollout: {...}          # RolloutState.to_json(): steps, step, thresholds, baselines, status, history

The server ignores `rollout` (a change of it alone reloads nothing), so the controller rewrites it every
interval: `status NAME` works from the config alone and a restarted controller resumes from it. A finished
rollout (promoted, rolled back, aborted, completed) removes the candidate block; its last record is kept next to
the config by the target (a sidecar file locally, an annotation on a RayService) for `status`.

Everything here is a pure function of config dicts; reading and writing them is the target's (targets.py).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rl_rollout.errors import RolloutError
from rl_rollout.judge import Limits

RUNNING, PAUSED = "running", "paused"
PROMOTED, ROLLED_BACK, ABORTED, COMPLETED = "promoted", "rolled_back", "aborted", "completed"
ACTIVE = (RUNNING, PAUSED)
FINISHED = (PROMOTED, ROLLED_BACK, ABORTED, COMPLETED)
MODES = ("split", "shadow")
DEFAULT_STEPS = (5.0, 25.0, 50.0, 100.0)
HISTORY_MAX = 100


def parse_steps(text: str) -> list[float]:
    """`5,25,50,100` -> [5.0, 25.0, 50.0, 100.0]: percents in (0, 100], strictly increasing, ending at 100 (the
    candidate takes all new sessions for one healthy interval before it is promoted)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        steps = [float(p.rstrip("%")) for p in parts]
    except ValueError:
        raise RolloutError(f"--steps {text!r}: expected comma-separated percents such as 5,25,50,100") from None
    for s in steps:
        if not 0.0 < s <= 100.0 or s != s:
            raise RolloutError(f"--steps {text!r}: {s:g} is not a percent in (0, 100]")
    for a, b in zip(steps, steps[1:]):
        if b <= a:
            raise RolloutError(f"--steps {text!r}: steps must increase ({b:g} after {a:g})")
    if steps[-1] != 100.0:
        raise RolloutError(f"--steps {text!r}: the last step must be 100 (the candidate serves every new session "
                           "for one healthy interval before it is promoted)")
    return steps


def weight_of(pct: float) -> float:
    return round(pct / 100.0, 6)


@dataclass
class RolloutState:
    id: str
    policy: str
    candidate: str  # the candidate's checkpoint as written in the config
    champion: str  # the champion's checkpoint when the rollout started
    mode: str = "split"
    steps: list[float] = field(default_factory=lambda: list(DEFAULT_STEPS))
    step: int = 0
    interval_s: float = 60.0
    min_episodes: int = 30
    min_requests: int = 20
    max_error_ratio: float = 0.05
    max_p99_ms: float = 500.0
    max_hold: int = 10
    min_agreement: float | None = None
    drain_timeout_s: float = 120.0
    apply_timeout_s: float = 180.0
    candidate_checkpoint_id: str | None = None
    champion_checkpoint_id: str | None = None
    registry: dict[str, Any] | None = None  # {root, name, version, ref} when the candidate is a registry version
    source: dict[str, Any] = field(default_factory=dict)  # {server, prometheus, prom_selector}
    started_at: float = 0.0
    step_started_at: float = 0.0
    baseline: dict[str, Any] = field(default_factory=dict)  # {"rollout": Snapshot json, "step": Snapshot json}
    status: str = RUNNING
    reason: str = ""
    holds: int = 0  # intervals in a row without a verdict at this step
    last: dict[str, Any] | None = None  # the last interval's decision: {at, action, rule, reason, figures}
    history: list[dict[str, Any]] = field(default_factory=list)  # transitions: start, advance, pause, ...
    controller: dict[str, Any] | None = None  # {host, pid, heartbeat} of the controller driving it, if any
    updated_at: float = 0.0
    outcome: dict[str, Any] | None = None  # finished rollouts: what promote did (registry move, drain)
    # Rolling back: the candidate takes no new sessions (weight 0) while the ones it has end; `reason` says why.
    draining: bool = False

    # ------------------------------------------------------------------ derived
    @property
    def weight(self) -> float:
        return 0.0 if self.draining else weight_of(self.steps[self.step])

    @property
    def step_pct(self) -> float:
        return self.steps[self.step]

    @property
    def next_pct(self) -> float | None:
        return self.steps[self.step + 1] if self.step + 1 < len(self.steps) else None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def limits(self) -> Limits:
        return Limits(max_error_ratio=self.max_error_ratio, max_p99_ms=self.max_p99_ms,
                      min_episodes=self.min_episodes, min_requests=self.min_requests, max_hold=self.max_hold,
                      min_agreement=self.min_agreement)

    def event(self, what: str, reason: str = "", now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.history.append({"at": round(now, 3), "event": what, "step": self.step, "weight": self.weight,
                             "reason": reason})
        del self.history[:-HISTORY_MAX]

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        return _plain(asdict(self))

    @classmethod
    def from_json(cls, raw: Any, where: str = "rollout") -> "RolloutState":
        if not isinstance(raw, dict):
            raise RolloutError(f"{where}: the rollout state is not a mapping")
        names = {f.name for f in fields(cls)}
        try:
            st = cls(**{k: v for k, v in raw.items() if k in names})
            st.steps = [float(s) for s in st.steps]
            if not 0 <= int(st.step) < len(st.steps):
                raise ValueError(f"step {st.step} outside steps {st.steps}")
            st.step = int(st.step)
        except (TypeError, ValueError) as e:
            raise RolloutError(f"{where}: unreadable rollout state ({e})") from None
        return st


def _plain(obj: Any) -> Any:
    """YAML/JSON-safe: tuples -> lists, non-finite floats -> strings."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return "+Inf" if obj > 0 else "-Inf"
    return obj


# ---------------------------------------------------------------------------------------------- the config
def user_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The PolicyServer deployment's user_config in a Serve config (what serving.launch reads)."""
    from serving.launch import LaunchError, policy_deployment

    try:
        dep = policy_deployment(cfg)
    except (LaunchError, KeyError, IndexError, TypeError) as e:
        raise RolloutError(f"not a policy server Serve config: {e}") from None
    uc = dep.get("user_config")
    if not isinstance(uc, dict) or not isinstance(uc.get("policies"), dict):
        raise RolloutError("the Serve config's PolicyServer deployment has no user_config.policies")
    return uc


def policy_spec(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """policies.NAME as a mapping ({checkpoint, candidate?}); an unknown NAME is bad input."""
    pols = user_config(cfg)["policies"]
    if name not in pols:
        raise RolloutError(f"unknown policy {name!r}: the config serves {', '.join(map(str, pols)) or 'none'}")
    spec = pols[name]
    spec = {"checkpoint": spec} if isinstance(spec, str) else dict(spec or {})
    if not isinstance(spec.get("checkpoint"), str) or not spec["checkpoint"]:
        raise RolloutError(f"policy {name!r} has no champion checkpoint in the config")
    return spec


def _set_spec(cfg: dict[str, Any], name: str, spec: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    pols = user_config(out)["policies"]
    was_string = isinstance(pols[name], str)
    pols[name] = spec["checkpoint"] if was_string and set(spec) == {"checkpoint"} else spec
    return out


def candidate_block(cfg: dict[str, Any], name: str) -> dict[str, Any] | None:
    cand = policy_spec(cfg, name).get("candidate")
    return dict(cand) if isinstance(cand, dict) else None


def read_rollout(cfg: dict[str, Any], name: str) -> RolloutState | None:
    """The rollout persisted in policies.NAME.candidate.rollout, or None."""
    cand = candidate_block(cfg, name)
    if not cand or cand.get("rollout") is None:
        return None
    return RolloutState.from_json(cand["rollout"], f"policies.{name}.candidate.rollout")


def with_rollout(cfg: dict[str, Any], st: RolloutState) -> dict[str, Any]:
    """The config with the candidate block written from `st` (checkpoint, the current step's weight, mode, state)."""
    spec = policy_spec(cfg, st.policy)
    spec["candidate"] = {"checkpoint": st.candidate, "weight": st.weight, "mode": st.mode, "rollout": st.to_json()}
    return _set_spec(cfg, st.policy, spec)


def without_candidate(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """The champion alone."""
    spec = policy_spec(cfg, name)
    spec.pop("candidate", None)
    return _set_spec(cfg, name, spec)


def promoted(cfg: dict[str, Any], name: str, checkpoint: str) -> dict[str, Any]:
    """champion := the candidate's checkpoint, candidate removed."""
    spec = policy_spec(cfg, name)
    spec.pop("candidate", None)
    spec["checkpoint"] = checkpoint
    return _set_spec(cfg, name, spec)
