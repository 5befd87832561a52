"""The rollout judge (rl_rollout.judge) and the figures it reads (rl_rollout.figures), on synthetic snapshots:
each rule, its order, holds and the hold bound, promotion at the last step, missing data, shadow mode; the Welch
test from sufficient statistics against scipy on the raw samples; histogram_quantile as Prometheus computes it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from rl_rollout.figures import (CountersReset, Snapshot, VersionFigures, Window, histogram_quantile, window)
from rl_rollout.judge import (ADVANCE, COMPLETE, HOLD, PAUSE, PROMOTE, ROLLBACK, Limits, judge, welch_less)

LE = (1.0, 5.0, 10.0, 100.0, math.inf)


def version(requests=200, errors=0, fast=True, returns=None, sessions=0, shadow=None) -> VersionFigures:
    """`requests` answered in <= 1 ms (fast) or 10..100 ms (slow); `returns` the ended episodes' returns."""
    counts = (requests, requests, requests, requests, requests) if fast else (0, 0, 0, requests, requests)
    r = np.asarray(returns if returns is not None else [], dtype=float)
    return VersionFigures(requests=requests, errors=errors, latency_le=LE, latency_counts=counts,
                          episodes=int(r.size), return_sum=float(r.sum()), return_sq_sum=float((r * r).sum()),
                          active_sessions=sessions, shadow=shadow)


def returns(mean, spread, n, seed=0):
    return list(np.random.default_rng(seed).normal(mean, spread, n))


GOOD = returns(100, 10, 40, seed=1)
CHAMP = returns(100, 10, 400, seed=2)
BAD = returns(20, 5, 40, seed=3)
LIMITS = Limits(max_error_ratio=0.05, max_p99_ms=50, min_episodes=30, min_requests=20, max_hold=3)


def decide(cand: VersionFigures, champ: VersionFigures | None = None, limits=LIMITS, **kw):
    w = Window(champ or version(2000, returns=CHAMP), cand, 10.0)
    kw.setdefault("step_pct", 5.0)
    kw.setdefault("next_pct", 25.0)
    return judge(w, w, limits, **kw)


# --------------------------------------------------------------------------------------------- rules
def test_healthy_candidate_advances_to_the_next_step():
    d = decide(version(returns=GOOD))
    assert d.action == ADVANCE and d.rule == "healthy"
    assert "-> 25%" in d.reason and "errors 0/200" in d.reason and "n=40 vs 400" in d.reason


def test_error_ratio_rolls_back_with_the_figures_in_the_line():
    d = decide(version(requests=412, errors=128, returns=GOOD))
    assert d.action == ROLLBACK and d.rule == "errors"
    assert d.reason == "candidate error ratio 0.311 > 0.05 over 412 requests at 5%"


def test_p99_rolls_back():
    d = decide(version(fast=False, returns=GOOD))
    assert d.action == ROLLBACK and d.rule == "latency"
    assert d.reason.startswith("candidate p99 99.1 ms > 50 ms over 200 requests")


def test_a_candidate_over_the_p99_bound_is_rolled_back_even_when_the_champion_is_as_slow():
    """Both versions over the bound in the same window is what a slow candidate on shared replicas looks like (its
    forwards hold up the champion's requests: a CI run measured 1000 ms on both sides behind a 2 s forward), so
    it is no excuse: the candidate is rolled back, before the return rule could judge it."""
    slow = dict(fast=False, returns=GOOD)
    d = decide(version(**slow), champ=version(2000, fast=False, returns=CHAMP))
    assert d.action == ROLLBACK and d.rule == "latency", d
    assert d.figures["champion_p99_ms"] > 50 and d.reason.startswith("candidate p99 99.1 ms > 50 ms"), d
    assert decide(version(fast=False, returns=BAD), champ=version(2000, fast=False, returns=CHAMP)).rule == "latency"


def test_errors_are_judged_before_latency_and_latency_before_returns():
    assert decide(version(requests=200, errors=100, fast=False, returns=BAD)).rule == "errors"
    assert decide(version(fast=False, returns=BAD)).rule == "latency"


def test_lower_mean_return_rolls_back_with_means_n_and_p():
    d = decide(version(returns=BAD))
    assert d.action == ROLLBACK and d.rule == "return"
    assert "candidate mean return" in d.reason and "< champion" in d.reason and "n=40 vs 400" in d.reason
    assert d.figures["p_value"] < 0.05


def test_a_slightly_lower_mean_without_significance_advances():
    d = decide(version(returns=returns(98, 10, 40, seed=4)))
    assert d.action == ADVANCE and d.figures["p_value"] >= 0.05


def test_too_few_episodes_holds_and_says_why():
    d = decide(version(returns=GOOD[:10]))
    assert d.action == HOLD and d.rule == "episodes"
    assert "10 candidate / 400 champion episodes" in d.reason and "need 30 each" in d.reason


def test_too_few_requests_at_the_step_holds_even_with_enough_episodes():
    d = decide(version(requests=5, returns=GOOD))
    assert d.action == HOLD and d.rule == "requests" and "5 candidate requests at this step, need 20" in d.reason


def test_few_requests_do_not_trigger_the_error_rule():
    assert decide(version(requests=3, errors=3, returns=GOOD)).action == HOLD


def test_the_hold_bound_pauses_without_retry():
    assert decide(version(returns=GOOD[:5]), holds=1).action == HOLD
    d = decide(version(returns=GOOD[:5]), holds=2)
    assert d.action == PAUSE and not d.retry and "after 3 intervals without a verdict" in d.reason


def test_rollback_rules_still_apply_while_holding():
    assert decide(version(requests=100, errors=50, returns=GOOD[:5]), holds=2).action == ROLLBACK


def test_last_step_promotes_after_a_healthy_interval():
    d = decide(version(returns=GOOD), step_pct=100.0, next_pct=None)
    assert d.action == PROMOTE and d.reason.endswith("promoting")


def test_last_step_never_promotes_without_data():
    assert decide(version(returns=GOOD[:3]), step_pct=100.0, next_pct=None).action == HOLD
    assert decide(version(requests=0, returns=GOOD), step_pct=100.0, next_pct=None).action == HOLD


@pytest.mark.parametrize("step,roll", [(None, None), ("w", None)])
def test_missing_figures_pause_and_retry(step, roll):
    w = Window(version(), version(returns=GOOD), 1.0)
    d = judge(w if step else None, roll, LIMITS, step_pct=100.0, next_pct=None,
              unavailable="Prometheus at http://x:9090 is unreachable: connection refused")
    assert d.action == PAUSE and d.retry and d.rule == "unavailable"
    assert d.reason == "paused at 100%: figures unavailable: Prometheus at http://x:9090 is unreachable: connection refused"


def test_equal_constant_returns_are_not_worse():
    """CartPole capped at the same length on both sides: zero variance, equal means -> not worse."""
    d = decide(version(returns=[100.0] * 40), version(2000, returns=[100.0] * 400))
    assert d.action == ADVANCE and d.figures["p_value"] == 1.0


def test_a_constant_lower_candidate_is_worse():
    d = decide(version(returns=[99.0] * 40), version(2000, returns=[100.0] * 400))
    assert d.action == ROLLBACK and d.figures["p_value"] == 0.0


# --------------------------------------------------------------------------------------------- shadow
def shadow(compared=200, agreed=200, errors=0, dropped=0):
    return {"compared": compared, "agreed": agreed, "errors": errors, "dropped": dropped}


def test_shadow_ignores_returns_and_completes_at_the_last_step():
    cand = version(requests=0, shadow=shadow())
    d = decide(cand, mode="shadow")
    assert d.action == ADVANCE and "agreement 1.000" in d.reason
    d = decide(cand, mode="shadow", step_pct=100.0, next_pct=None)
    assert d.action == COMPLETE


def test_shadow_errors_roll_back_and_low_agreement_only_with_min_agreement():
    assert decide(version(requests=0, shadow=shadow(100, 100, errors=50)), mode="shadow").rule == "errors"
    low = version(requests=0, shadow=shadow(200, 60))
    assert decide(low, mode="shadow").action == ADVANCE
    lim = Limits(**{**LIMITS.to_json(), "min_agreement": 0.9})
    d = decide(low, mode="shadow", limits=lim)
    assert d.action == ROLLBACK and d.reason.startswith("candidate agreement 0.300 < 0.9 over 200 compared")


def test_shadow_without_mirrored_requests_holds():
    assert decide(version(requests=0, shadow=shadow(3, 3)), mode="shadow").rule == "requests"


# --------------------------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("seed", range(5))
def test_welch_from_sufficient_statistics_equals_scipy_on_the_samples(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(90, 15, 35), rng.normal(100, 5, 300)
    t, p = welch_less(version(returns=a), version(returns=b))
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="less")
    assert t == pytest.approx(ref.statistic, rel=1e-6) and p == pytest.approx(ref.pvalue, rel=1e-6, abs=1e-300)


def test_histogram_quantile_interpolates_like_prometheus():
    le = (1.0, 5.0, 10.0, math.inf)
    assert histogram_quantile(0.99, le, (50, 90, 100, 100)) == pytest.approx(9.5)
    assert histogram_quantile(0.5, le, (10, 10, 10, 10)) == pytest.approx(0.5)  # first bucket starts at 0
    assert histogram_quantile(0.5, le, (0, 0, 0, 10)) == 10.0  # the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.99, le, (0, 0, 0, 0)) is None


# --------------------------------------------------------------------------------------------- windows
def snap(at, **kw) -> Snapshot:
    return Snapshot(at=at, champion=version(**kw), candidate=version(**kw))


def test_window_subtracts_counters_buckets_and_return_sums():
    a = snap(0.0, requests=100, returns=[1.0, 2.0])
    b = snap(10.0, requests=250, errors=5, returns=[1.0, 2.0, 3.0, 4.0])
    w = window(b, a)
    assert (w.candidate.requests, w.candidate.errors, w.candidate.episodes) == (150, 5, 2)
    assert w.candidate.latency_counts == (150,) * 5 and w.candidate.return_sum == 7.0
    assert w.candidate.return_sq_sum == 25.0 and w.seconds == 10.0


def test_window_of_a_candidate_that_appeared_after_the_baseline_starts_at_zero():
    base = Snapshot(at=0.0, champion=version(100))
    w = window(Snapshot(at=5.0, champion=version(130), candidate=version(30)), base)
    assert (w.champion.requests, w.candidate.requests) == (30, 30)


def test_counters_going_backwards_raise():
    with pytest.raises(CountersReset, match="went from 250 to 100"):
        window(snap(1.0, requests=100), snap(0.0, requests=250))


def test_snapshot_json_round_trip_keeps_the_infinite_bucket():
    s = snap(3.0, requests=7, returns=[1.5], shadow=shadow(4, 3))
    raw = s.to_json()
    assert raw["candidate"]["latency_le"][-1] == "+Inf"
    assert Snapshot.from_json(raw) == Snapshot(s.at, s.champion, s.candidate, s.source)
