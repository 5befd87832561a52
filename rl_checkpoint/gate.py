"""The promotion gate: may a candidate evaluation replace the champion's? A pure function of two EvalRecords.

Rules, checked in this order (the first that fails refuses):

    no_evaluation   the candidate has no evaluation record
    min_return      the lower end of the candidate's 95% CI of the mean greedy return is under the floor:
                    `min_return` when given, else the env's solved threshold (rl_envs' `solved_return`; none for
                    an env without one)
    env_mismatch    candidate and champion were evaluated on different envs (never overridable)
    not_better      the candidate is not better than the champion by a one-sided Welch t-test at 95%
                    (H1: candidate mean > champion mean; scipy.stats.ttest_ind(equal_var=False,
                    alternative="greater"), allowed when p < alpha)

No champion, or a champion without an evaluation (promoted with --force), passes `not_better`: there is nothing
to be better than. Degenerate samples: a one-episode sample counts as zero variance (Welch's statistic then
reduces to a one-sample t-test against the other mean); two zero-variance samples (e.g. CartPole capped at 500
both times) are "better" iff the candidate's mean is strictly greater (p is then 0 or 1). A perfect champion is
therefore never beaten by an equally perfect candidate: replace it with a forced promotion.

Users: rl_checkpoint.registry (`Registry.promote`, `Registry.gate`) and the rollout work that promotes
automatically.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from rl_checkpoint.evaluation import EvalRecord

ALPHA = 0.05
PASSED, NO_EVALUATION, MIN_RETURN, ENV_MISMATCH, NOT_BETTER = (
    "passed", "no_evaluation", "min_return", "env_mismatch", "not_better")
RULES = (NO_EVALUATION, MIN_RETURN, ENV_MISMATCH, NOT_BETTER)


@dataclass(frozen=True)
class GateDecision:
    allowed: bool
    rule: str  # PASSED or the first rule that refused
    message: str  # one line naming the rule and the figures
    figures: dict[str, Any] = field(default_factory=dict)
    forceable: bool = True  # whether a forced promotion may override the refusal

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def solved_return(env: str | None) -> float | None:
    """The env's solved threshold (None for an unknown env or one without a threshold). rl_envs is imported here,
    not at module import: it pulls gymnasium, which readers of the checkpoint contract need not load."""
    if not env:
        return None
    try:
        import rl_envs
        spec = rl_envs.get_spec(env)
    except Exception:  # an env this installation does not know: no floor from it
        return None
    return getattr(spec, "solved_return", None)


def welch_greater(candidate: list[float], champion: list[float]) -> tuple[float, float]:
    """(t, one-sided p) for H1: mean(candidate) > mean(champion), Welch's unequal-variance t-test."""
    import numpy as np
    from scipy import stats

    a, b = np.asarray(candidate, dtype=np.float64), np.asarray(champion, dtype=np.float64)
    va = float(a.var(ddof=1)) if a.size > 1 else 0.0
    vb = float(b.var(ddof=1)) if b.size > 1 else 0.0
    diff = float(a.mean() - b.mean())
    se2 = va / a.size + vb / b.size
    if se2 == 0.0:  # two constant samples: decided by the means alone
        return (math.inf if diff > 0 else -math.inf if diff < 0 else 0.0), (0.0 if diff > 0 else 1.0)
    if va > 0 and vb > 0:
        with warnings.catch_warnings():  # scipy warns on nearly identical data; the statistic is still right
            warnings.simplefilter("ignore", RuntimeWarning)
            res = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
        return float(res.statistic), float(res.pvalue)
    # One side has zero variance (constant, or a single episode): Welch-Satterthwaite without its term, i.e. a
    # one-sample t-test of the other side against this side's mean.
    t = diff / math.sqrt(se2)
    df = se2 ** 2 / sum((v / n) ** 2 / (n - 1) for v, n in ((va, a.size), (vb, b.size)) if v > 0)
    return t, float(stats.t.sf(t, df))


def _describe(r: EvalRecord) -> str:
    return f"mean {r.mean:.2f} (95% CI {r.ci95[0]:.2f}..{r.ci95[1]:.2f}, n={r.episodes})"


def _figures(r: EvalRecord) -> dict[str, Any]:
    return {"eval_id": r.eval_id, "env": r.env, "mean": r.mean, "std": r.std, "ci95": list(r.ci95),
            "episodes": r.episodes}


def judge(candidate: EvalRecord | None, champion: EvalRecord | None, *, min_return: float | None = None,
          env_solved: float | None = None, alpha: float = ALPHA, candidate_name: str = "candidate",
          champion_name: str = "champion") -> GateDecision:
    """Apply the rules above. `champion` is None when there is no champion or it has no evaluation."""
    floor, floor_source = ((min_return, "--min-return") if min_return is not None
                           else (env_solved, "the env's solved threshold") if env_solved is not None else (None, None))
    figures: dict[str, Any] = {"min_return": floor, "min_return_source": floor_source, "alpha": alpha}
    if candidate is None:
        return GateDecision(False, NO_EVALUATION, f"rule {NO_EVALUATION}: {candidate_name} has no evaluation "
                            "(evaluate its checkpoint first, e.g. with rl-eval)", figures)
    figures["candidate"] = _figures(candidate)
    cand = f"{candidate_name} {_describe(candidate)}"
    if floor is not None and candidate.ci95[0] < floor:
        return GateDecision(False, MIN_RETURN, f"rule {MIN_RETURN}: {candidate_name}'s 95% CI lower bound "
                            f"{candidate.ci95[0]:.2f} is under {floor:g} ({floor_source}); {cand}", figures)
    floor_note = f", CI lower bound {candidate.ci95[0]:.2f} >= {floor:g}" if floor is not None else ""
    if champion is None:
        return GateDecision(True, PASSED, f"{PASSED}: {cand}{floor_note}; no evaluated champion to beat", figures)
    figures["champion"] = _figures(champion)
    champ = f"{champion_name} {_describe(champion)}"
    if candidate.env and champion.env and candidate.env != champion.env:
        return GateDecision(False, ENV_MISMATCH, f"rule {ENV_MISMATCH}: {candidate_name} was evaluated on "
                            f"{candidate.env!r}, {champion_name} on {champion.env!r}", figures, forceable=False)
    t, p = welch_greater(candidate.returns, champion.returns)
    figures.update(t=t if math.isfinite(t) else None, p_value=p)  # JSON has no inf
    test = f"one-sided Welch t-test p={p:.3g}"
    if not p < alpha:
        return GateDecision(False, NOT_BETTER, f"rule {NOT_BETTER}: {cand} is not better than {champ} at "
                            f"{1 - alpha:.0%} ({test} >= {alpha:g})", figures)
    return GateDecision(True, PASSED, f"{PASSED}: {cand} is better than {champ} ({test} < {alpha:g}){floor_note}",
                        figures)
