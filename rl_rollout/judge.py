"""The rollout judge: one decision per analysis interval, a pure function of the figures (no I/O).

Rules, in this order (the first that applies decides):

  unavailable  the figures could not be read this interval          -> pause (retry next interval; never promote)
  errors       candidate error ratio since the step started > max   -> rollback
               (judged once the candidate has >= min_requests requests at this step)
  latency      candidate p99 since the step started > max_p99_ms    -> rollback   (same minimum)
               whatever the champion's p99: both versions share the replicas, so a slow candidate's forwards
               delay the champion's requests too, and "both slow" cannot tell a loaded node from a slow candidate
               (a rollback is the safe mistake; a loaded node calls for a larger --max-p99-ms)
  agreement    shadow mode with min_agreement: agreed/compared < it -> rollback   (same minimum)
  return       split mode, once both versions have >= min_episodes ended episodes since the rollout started:
               one-sided Welch t-test at 95% (H1: candidate mean < champion mean) from the sufficient statistics
               (n, sum, sum of squares; scipy.stats.ttest_ind_from_stats(equal_var=False, alternative="less")),
               p < alpha                                            -> rollback
  enough data  fewer than min_requests candidate requests at this step, or (split) fewer than min_episodes
               episodes on either side                              -> hold (stay at this step);
               the max_hold-th interval in a row without a verdict  -> pause (the controller stops; resume/abort)
  healthy      not the last step                                    -> advance to the next step
               the last step                                        -> promote (split) / complete (shadow)

Two constant samples (e.g. CartPole capped at the same length on both sides) are decided by their means alone,
as the offline gate does (rl_checkpoint.gate.welch_greater): worse iff the candidate's mean is strictly lower.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from rl_rollout.figures import VersionFigures, Window

ALPHA = 0.05
ROLLBACK, ADVANCE, PROMOTE, COMPLETE, HOLD, PAUSE = "rollback", "advance", "promote", "complete", "hold", "pause"


@dataclass(frozen=True)
class Limits:
    max_error_ratio: float = 0.05
    max_p99_ms: float = 500.0
    min_episodes: int = 30
    min_requests: int = 20
    max_hold: int = 10
    min_agreement: float | None = None  # shadow mode only; None: agreement is reported, not judged
    alpha: float = ALPHA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    action: str  # ROLLBACK | ADVANCE | PROMOTE | COMPLETE | HOLD | PAUSE
    reason: str  # one line with the figures
    rule: str  # which rule decided: unavailable, errors, latency, agreement, return, requests, episodes, healthy
    figures: dict[str, Any] = field(default_factory=dict)
    retry: bool = False  # PAUSE only: True while figures are unavailable (keep trying), False for the hold bound

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def welch_less(cand: VersionFigures, champ: VersionFigures) -> tuple[float, float]:
    """(t, one-sided p) for H1: mean(candidate) < mean(champion), Welch's t-test from n, mean and sample std."""
    from scipy import stats

    m1, s1, n1 = cand.mean_return, cand.std_return, cand.episodes
    m2, s2, n2 = champ.mean_return, champ.std_return, champ.episodes
    if s1 * s1 / n1 + s2 * s2 / n2 == 0.0:  # two constant samples: the means decide
        diff = m1 - m2
        return (-math.inf if diff < 0 else math.inf if diff > 0 else 0.0), (0.0 if diff < 0 else 1.0)
    with warnings.catch_warnings():  # scipy warns on nearly identical data; the statistic is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_ind_from_stats(m1, s1, n1, m2, s2, n2, equal_var=False, alternative="less")
    t, p = float(res.statistic), float(res.pvalue)
    return t, (1.0 if math.isnan(p) else p)


def _pct(weight_pct: float) -> str:
    return f"{weight_pct:g}%"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def judge(step: Window | None, rollout: Window | None, limits: Limits, *, mode: str = "split",
          step_pct: float = 100.0, next_pct: float | None = None, holds: int = 0,
          unavailable: str | None = None) -> Decision:
    """Decide this interval. `step`: the window since the current step started; `rollout`: since the rollout
    started; `next_pct` None at the last step; `holds`: intervals in a row without a verdict before this one."""
    at = _pct(step_pct)
    if unavailable is not None or step is None or rollout is None:
        why = unavailable or "no figures"
        return Decision(PAUSE, f"paused at {at}: figures unavailable: {why}", "unavailable", retry=True)

    c = step.candidate
    shadow = mode == "shadow"
    if shadow:  # the candidate answers no one: its attempts are the mirrored requests
        s = c.shadow or {}
        attempts, errors = s.get("compared", 0) + s.get("errors", 0), s.get("errors", 0)
    else:
        attempts, errors = c.requests, c.errors
    ratio = errors / attempts if attempts else None
    p99 = c.quantile(0.99)
    figs: dict[str, Any] = {"step_pct": step_pct, "candidate_requests": attempts, "candidate_errors": errors,
                            "error_ratio": ratio, "p99_ms": p99, "latency_count": c.latency_count,
                            "champion_p99_ms": step.champion.quantile(0.99)}
    what = "mirrored requests" if shadow else "requests"
    judged = attempts >= limits.min_requests

    if judged and ratio is not None and ratio > limits.max_error_ratio:
        return Decision(ROLLBACK, f"candidate error ratio {ratio:.3f} > {limits.max_error_ratio:g} over {attempts} "
                        f"{what} at {at}", "errors", figs)
    if c.latency_count >= limits.min_requests and p99 is not None and p99 > limits.max_p99_ms:
        return Decision(ROLLBACK, f"candidate p99 {p99:.1f} ms > {limits.max_p99_ms:g} ms over "
                        f"{c.latency_count:.0f} requests at {at}", "latency", figs)
    agreement = None
    if shadow:
        agreement = c.agreement
        s = c.shadow or {}
        figs.update(agreement=agreement, compared=s.get("compared", 0), dropped=s.get("dropped", 0))
        if (limits.min_agreement is not None and judged and agreement is not None
                and agreement < limits.min_agreement):
            return Decision(ROLLBACK, f"candidate agreement {agreement:.3f} < {limits.min_agreement:g} over "
                            f"{s.get('compared', 0)} compared actions at {at}", "agreement", figs)

    ret_text = ""
    hold: tuple[str, str] | None = None
    if not shadow:
        rc, rh = rollout.candidate, rollout.champion
        figs.update(candidate_episodes=rc.episodes, champion_episodes=rh.episodes,
                    candidate_mean=rc.mean_return, champion_mean=rh.mean_return)
        if rc.episodes >= limits.min_episodes and rh.episodes >= limits.min_episodes:
            t, p = welch_less(rc, rh)
            figs.update(t=t if math.isfinite(t) else None, p_value=p)
            test = (f"n={rc.episodes} vs {rh.episodes}, one-sided Welch p={p:.3g}")
            if p < limits.alpha:
                return Decision(ROLLBACK, f"candidate mean return {rc.mean_return:.2f} < champion "
                                f"{rh.mean_return:.2f} ({test} < {limits.alpha:g}) at {at}", "return", figs)
            ret_text = f", return {rc.mean_return:.2f} vs {rh.mean_return:.2f} ({test})"
        else:
            hold = ("episodes", f"{rc.episodes} candidate / {rh.episodes} champion episodes ended since the rollout "
                    f"started, need {limits.min_episodes} each (--min-episodes)")
    if not judged:  # too few requests at this step comes first: it says why the step has no data yet
        hold = ("requests", f"{attempts} candidate {what} at this step, need {limits.min_requests} (--min-requests)")
    if hold is not None:
        rule, why = hold
        if holds + 1 >= limits.max_hold:
            return Decision(PAUSE, f"paused at {at} after {holds + 1} intervals without a verdict (--max-hold "
                            f"{limits.max_hold}): {why}", rule, figs)
        return Decision(HOLD, f"holding at {at} ({holds + 1}/{limits.max_hold}): {why}", rule, figs)

    health = f"errors {errors}/{attempts}, p99 {_ms(p99)}{ret_text}"
    if shadow:
        health += f", agreement {'n/a' if agreement is None else f'{agreement:.3f}'}"
    if next_pct is not None:
        return Decision(ADVANCE, f"healthy at {at}: {health}; -> {_pct(next_pct)}", "healthy", figs)
    if shadow:
        return Decision(COMPLETE, f"shadow passed at {at}: {health}", "healthy", figs)
    return Decision(PROMOTE, f"healthy at {at}: {health}; promoting", "healthy", figs)
