"""Off-policy estimates: rank a candidate checkpoint on logged transitions before it takes any traffic.

`rl-eval CHECKPOINT --offline LOG` estimates the mean episode return of the checkpoint's *greedy* policy (the
action the server would return) from complete episodes of a transition log (rl_eval.logs), by importance sampling
against the policy that acted (its logged `action_logp`):

    w_t  = pi(a_t | s_t) / b(a_t | s_t)       pi: the candidate, greedy: 1 if its action is the logged one, else 0
    is   = (sum_t r_t) * prod_t w_t                                    per episode, ordinary importance sampling
    pdis = sum_t r_t * prod_{k<=t} w_k                                 per-decision importance sampling (default)

Undiscounted, like the online evaluation; the estimate is the mean over logged episodes, with the same 95%
percentile bootstrap interval as `rl-eval`'s records. Written beside the online evaluations, under the checkpoint's
`offline_estimates/` (and, for a `registry:` reference, into the version's record), never read by the gate.

What it means when the logging policy was greedy too (the policy server acts greedily: logp 0, b = 1): a weight is
1 while the candidate picks the logged action and 0 from its first disagreement on, so `pdis` is the return the
logged episodes collected *before the candidate would first have acted differently*, and `is` counts only
episodes it would have played identically. Up to that point the candidate's own rollout is the logged one, so
with non-negative rewards (CartPole) both are lower bounds of its expected return on the logged start states,
tight for a candidate that agrees with the logging policy and uninformative for one that differs early (it may be
better or worse there: deterministic logs hold no data on other actions). `agreement` (share of logged steps
whose action the candidate repeats) says which case it is. A stochastic logging policy (logp < 0) makes these the
usual unbiased estimators, as long as it gave every action the candidate takes a non-zero probability.

RLlib's own OPE (OfflinePolicyEvaluationRunner, offline_evaluation_type "is"/"pdis") is not used: it evaluates
the algorithm's own module inside a training run, not a checkpoint, and weighs each logged action by the
probability of an action *sampled* from the module rather than of the logged one (and its "pdis" sums single-step
ratios instead of their running products), so it is not importance sampling of the logged actions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rl_checkpoint.evaluation import CI_METHOD, bootstrap_ci, new_eval_id
from rl_eval.episodes import EvalError

METHODS = ("pdis", "is")
ESTIMATES_DIR = "offline_estimates"
ESTIMATE_FORMAT_VERSION = 1
_CHUNK = 512  # observations per forward pass (the server's act_batch limit is 1024)


@dataclass(frozen=True)
class OffPolicyEstimate:
    """One off-policy estimate of one checkpoint's greedy policy on one transition log."""

    estimate_id: str
    checkpoint_id: str
    env: str | None
    method: str  # pdis | is
    data: str  # the log's location (secrets redacted)
    estimates: list[float]  # per logged episode, in log order
    mean: float
    ci95: list[float]
    agreement: float  # share of logged steps whose action the candidate's greedy policy repeats
    episodes_agreed: float  # share of logged episodes it would have played identically
    behaviour: str  # deterministic (every logged logp is 0) | stochastic
    behaviour_return_mean: float  # what the logging policy got on these episodes (its on-policy return)
    transitions: int  # in the complete episodes used
    skipped_transitions: int  # in incomplete episodes (still open when logged, or sampled out)
    wall_s: float
    created: str
    checkpoint: str | None = None
    greedy: bool = True
    ci_method: str = CI_METHOD
    format_version: int = ESTIMATE_FORMAT_VERSION

    @property
    def episodes(self) -> int:
        return len(self.estimates)

    def summary(self) -> dict[str, Any]:
        return {"estimate_id": self.estimate_id, "method": self.method, "episodes": self.episodes,
                "mean": round(self.mean, 3), "ci95": [round(x, 3) for x in self.ci95],
                "agreement": round(self.agreement, 4), "behaviour": self.behaviour,
                "behaviour_return_mean": round(self.behaviour_return_mean, 3), "data": self.data,
                "created": self.created}

    def line(self) -> str:
        return (f"{self.checkpoint_id}: off-policy {self.method} estimate {self.mean:.2f} (95% CI "
                f"{self.ci95[0]:.2f}..{self.ci95[1]:.2f}) over {self.episodes} logged episodes "
                f"({self.transitions} transitions, {self.skipped_transitions} skipped), agreement "
                f"{self.agreement:.1%} of steps, {self.episodes_agreed:.1%} of episodes; logging policy "
                f"{self.behaviour}, returned {self.behaviour_return_mean:.2f}; on {self.env} in {self.wall_s:.1f}s")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["episodes"] = self.episodes
        return out


def _target_probs(pol, episodes, action_kind: str) -> list[np.ndarray]:
    """Per episode, the greedy policy's probability of each logged action: 1 where it picks it, else 0."""
    obs = np.concatenate([e.obs for e in episodes])
    actions: list[Any] = []
    for i in range(0, len(obs), _CHUNK):
        actions.extend(pol.act(pol.observations(obs[i:i + _CHUNK])))
    greedy = np.asarray(actions)
    logged = np.concatenate([e.actions for e in episodes])
    same = greedy == logged if action_kind == "discrete" else np.all(greedy == logged, axis=-1)
    out, start = [], 0
    for e in episodes:
        out.append(same[start:start + len(e.rewards)].astype(np.float64))
        start += len(e.rewards)
    return out


def importance_estimates(rewards: Sequence[np.ndarray], weights: Sequence[np.ndarray], method: str) -> list[float]:
    """Per-episode estimates from per-step rewards and importance weights pi/b (see the module docstring)."""
    out = []
    for r, w in zip(rewards, weights):
        running = np.cumprod(w)
        out.append(float(r.sum() * running[-1]) if method == "is" else float(np.dot(r, running)))
    return out


def estimate(location: str, data: str, *, method: str = "pdis", select: str = "latest", env: str | None = None,
             record: bool = True):
    """-> (OffPolicyEstimate, where it was written or None, the registry Version or None). Raises
    EvalError/CheckpointError for bad input."""
    from gymnasium import spaces

    from rl_checkpoint import CheckpointError, redact
    from rl_eval.cli import _env_of, target
    from rl_eval.episodes import load_policy, make_env
    from rl_eval.logs import ESTIMATE_COLUMNS, LogError, check_log, find_log, read_episodes

    if method not in METHODS:
        raise EvalError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    t0 = time.time()
    ckpt, version = target(location, select)
    env_name, env_config = _env_of(ckpt, env)
    gym_env = make_env(env_name, env_config)
    try:
        obs_space, act_space = gym_env.observation_space, gym_env.action_space
    finally:
        gym_env.close()
    if isinstance(act_space, spaces.Discrete):
        kind = "discrete"
    elif isinstance(act_space, spaces.MultiDiscrete):
        kind = "multidiscrete"
    else:
        raise EvalError(f"env {env_name!r} has continuous actions ({act_space}): a greedy policy gives a logged "
                        "action probability 0, so importance sampling cannot weigh it")
    try:
        log = find_log(data, "--offline")
        check_log(log, obs_space, act_space, env_name, columns=ESTIMATE_COLUMNS)
        episodes, skipped = read_episodes(log)
    except LogError as e:
        raise EvalError(str(e)) from None
    if not episodes:
        raise EvalError(f"--offline {log.shown} holds no complete episode (t from 0 without a gap, ending "
                        f"terminated or truncated); {skipped} transitions in incomplete ones")
    pol = load_policy(ckpt.storage.uri())
    try:
        if pol.framestack > 1:
            raise EvalError(f"checkpoint {ckpt.location} stacks {pol.framestack} frames; a transition log holds "
                            "single observations, so it cannot be replayed to it")
        probs = _target_probs(pol, episodes, kind)
    finally:
        pol.release()
    behaviour_logp = np.concatenate([e.behaviour_logp for e in episodes])
    if np.any(behaviour_logp > 0) or not np.all(np.isfinite(behaviour_logp)):
        raise EvalError(f"--offline {log.shown}: column action_logp holds values that are not log-probabilities "
                        "(> 0 or not finite)")
    weights = [p / np.exp(e.behaviour_logp) for p, e in zip(probs, episodes)]
    values = importance_estimates([e.rewards for e in episodes], weights, method)
    lo, hi = bootstrap_ci(values)
    steps = sum(len(e.rewards) for e in episodes)
    rec = OffPolicyEstimate(
        estimate_id=new_eval_id(), checkpoint_id=ckpt.checkpoint_id, env=env_name, method=method,
        data=redact(data), estimates=values, mean=float(np.mean(values)), ci95=[lo, hi],
        agreement=float(sum(p.sum() for p in probs) / steps),
        episodes_agreed=float(np.mean([bool(p.all()) for p in probs])),
        behaviour="deterministic" if np.all(behaviour_logp == 0) else "stochastic",
        behaviour_return_mean=float(np.mean([e.rewards.sum() for e in episodes])), transitions=steps,
        skipped_transitions=skipped, wall_s=round(time.time() - t0, 3),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), checkpoint=ckpt.location)
    if not math.isfinite(rec.mean):
        raise EvalError(f"the {method} estimate is not finite ({rec.mean}); check the log's rewards and action_logp")
    if not record:
        return rec, None, None
    try:
        where = write_estimate(ckpt.storage, rec)
        if version is not None:
            from rl_checkpoint.registry import Registry, parse_ref

            root, name, _ = parse_ref(location)
            version = Registry.open(root).record_estimate(name, version.version, rec.to_json())
    except CheckpointError as e:  # RegistryError too: keep the figures in the message
        raise EvalError(f"{e} (rerun with --no-record to only print); estimated: {rec.line()}") from None
    return rec, where, version


def write_estimate(ckpt, rec: OffPolicyEstimate) -> str:
    """Add the record under the checkpoint's offline_estimates/ (never replacing one); -> where it went."""
    from rl_checkpoint import CheckpointError, redact

    rel = (ESTIMATES_DIR, f"{rec.estimate_id}.json")
    if ckpt.exists(*rel):
        raise CheckpointError(f"off-policy estimate {redact(ckpt.uri(*rel))} already exists")
    try:
        ckpt.write_json(rec.to_json(), *rel)
    except OSError as e:
        raise CheckpointError(f"cannot write the off-policy estimate to {redact(ckpt.uri(*rel))}: {e}") from None
    return ckpt.uri(*rel)
