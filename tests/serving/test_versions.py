"""Versions under one policy name (issue 20): a candidate next to the champion, split or shadow, sticky sessions,
episode feedback, per-version figures and metrics, promotion without a reload.

The live tests share one real `python -m serving` (module scope) and change its config by rewriting the config
file only: the server applies a changed file by itself (no SIGHUP), which is also how the rollout controller
drives it. The in-process tests run `serving.versions` on real checkpoints where HTTP adds nothing (a candidate
whose forward raises, frame stacks across a promotion).
"""

from __future__ import annotations

import math
import threading
import time
import uuid

import numpy as np
import pytest
import requests

from conftest import ServerProcess, metric_samples, scrape
from serving.config import ServerConfig
from serving.versions import hash01
from test_api import cartpole_observations, checkpoint_id
from trainer_helpers import wait_for

pytestmark = pytest.mark.serve

MAX_ITEMS = 64  # the server's max_batch_items (feedback batches above it: 413)


# ------------------------------------------------------------------------------------------- config (no server)


BAD_CANDIDATES = [
    ({"checkpoint": "c", "weight": 1.5}, "candidate.weight must be a number in [0, 1], got 1.5"),
    ({"checkpoint": "c", "weight": -0.1}, "candidate.weight must be a number in [0, 1], got -0.1"),
    ({"checkpoint": "c", "weight": "x"}, "candidate.weight must be a number in [0, 1], got 'x'"),
    ({"checkpoint": "c", "weight": True}, "candidate.weight must be a number in [0, 1], got True"),
    ({"checkpoint": "c", "weight": float("nan")}, "candidate.weight must be a number in [0, 1], got nan"),
    ({"checkpoint": "c", "mode": "canary"}, "candidate.mode must be one of ['split', 'shadow'], got 'canary'"),
    ({"checkpoint": "c", "wieght": 0.1}, "candidate: unknown keys ['wieght']"),
    ({"weight": 0.1}, "candidate.checkpoint must be a path, URI or registry reference string"),
    ({"checkpoint": "c", "rollout": [1, 2]}, "candidate.rollout must be a mapping"),
    ("c", "candidate must be a mapping"),
]


@pytest.mark.parametrize("cand,message", BAD_CANDIDATES, ids=[m.split(" ")[0] + str(i) for i, (_, m) in
                                                                 enumerate(BAD_CANDIDATES)])
def test_bad_candidate_config_is_refused_naming_the_key(cand, message):
    with pytest.raises(ValueError) as e:
        ServerConfig.parse({"policies": {"cp": {"checkpoint": "a", "candidate": cand}}})
    assert f"user_config.policies.cp.{message}" in str(e.value)


def test_candidate_config_defaults_and_role_weights():
    cfg = ServerConfig.parse({"policies": {"cp": {"checkpoint": "a", "candidate": {"checkpoint": "b"}},
                                           "other": "c"}})
    assert cfg.policies == {"cp": "a", "other": "c"}
    spec = cfg.candidates["cp"]
    assert (spec.checkpoint, spec.weight, spec.mode, spec.rollout) == ("b", 0.0, "split", None)
    split = ServerConfig.parse({"policies": {"cp": {"checkpoint": "a", "candidate": {"checkpoint": "b", "weight": 0.25,
                                                                                     "rollout": {"step": 1}}}}})
    assert split.candidates["cp"].role_weight("champion") == 0.75
    assert split.candidates["cp"].role_weight("candidate") == 0.25
    shadow = ServerConfig.parse({"policies": {"cp": {"checkpoint": "a", "candidate": {"checkpoint": "b", "weight": 0.25,
                                                                                      "mode": "shadow"}}}})
    assert shadow.candidates["cp"].role_weight("champion") == 1.0
    # The rollout state is not part of what decides a reload.
    assert split.candidates["cp"] == ServerConfig.parse(
        {"policies": {"cp": {"checkpoint": "a", "candidate": {"checkpoint": "b", "weight": 0.25,
                                                              "rollout": {"step": 2}}}}}).candidates["cp"]


# ------------------------------------------------------------------------------------------- live server


@pytest.fixture(scope="module")
def srv(serving_workdir, cartpole_checkpoint):
    d = serving_workdir / "versions"
    d.mkdir()
    s = ServerProcess(d, {"default": cartpole_checkpoint}, max_batch_items=MAX_ITEMS)
    yield s
    rc = s.stop()
    assert rc == 0, f"server exited {rc} on SIGINT:\n{s.log_tail()}"


def apply(srv: ServerProcess, spec, expect: str = "reloaded", check_paths: bool = True, timeout_s: float = 180) -> dict:
    """Write the config file (policy `default` := spec) and wait for the server's own reaction to the changed file:
    the first `reloaded` / `reload_failed` event, which must be `expect`."""
    srv.user_config["revision"] = uuid.uuid4().hex  # the file always changes, so an event always comes
    srv.write_config({"default": spec}, check_paths=check_paths)
    ev = srv.wait_event(("reloaded", "reload_failed"), timeout_s)
    assert ev["event"] == expect, f"expected {expect}, got {ev}\n{srv.log_tail()}"
    assert ev.get("trigger") == "config_changed", ev
    return ev


def spec(champion: str, cand: str | None = None, weight: float = 0.0, mode: str = "split", **extra):
    if cand is None:
        return champion
    return {"checkpoint": champion, "candidate": {"checkpoint": cand, "weight": weight, "mode": mode, **extra}}


def act(srv, obs, sid: str | None = None, s: requests.Session | None = None) -> dict:
    body = {"observation": [float(x) for x in obs]}
    if sid is not None:
        body["session_id"] = sid
    r = (s or requests).post(srv.base + "/v1/policies/default/act", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def info(srv) -> dict:
    r = requests.get(srv.base + "/v1/policies/default", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def stats(srv) -> dict:
    r = requests.get(srv.base + "/v1/policies/default/stats", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def feedback(srv, body, raw: bytes | None = None) -> requests.Response:
    url = srv.base + "/v1/policies/default/feedback"
    if raw is not None:
        return requests.post(url, data=raw, headers={"Content-Type": "application/json"}, timeout=30)
    return requests.post(url, json=body, timeout=30)


def test_every_answer_names_its_version_and_sessionless_requests_split_by_weight(srv, cartpole_checkpoint,
                                                                                cartpole_v2_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.3))
    ids = {"champion": checkpoint_id(cartpole_checkpoint), "candidate": checkpoint_id(cartpole_v2_checkpoint)}
    cand = info(srv)["candidate"]
    assert cand["checkpoint_id"] == ids["candidate"] and cand["weight"] == 0.3 and cand["mode"] == "split", cand
    n, seen = 600, {"champion": 0, "candidate": 0}
    s = requests.Session()
    for o in cartpole_observations(n, seed=3):
        r = act(srv, o, s=s)
        assert r["checkpoint_id"] == ids[r["version"]], r
        seen[r["version"]] += 1
    # Binomial(600, 0.3): sd 11.2; 4.5 sd either side.
    assert abs(seen["candidate"] - 0.3 * n) <= 4.5 * math.sqrt(n * 0.3 * 0.7), seen
    r = requests.post(srv.base + "/v1/policies/default/act_batch",
                      json={"observations": cartpole_observations(8).tolist()}, timeout=30).json()
    assert r["checkpoint_id"] == ids[r["version"]] and len(r["actions"]) == 8, r
    st = stats(srv)["versions"]
    assert st["champion"]["weight"] == 0.7 and st["candidate"]["weight"] == 0.3 and st["candidate"]["mode"] == "split"
    assert st["champion"]["requests"] + st["candidate"]["requests"] >= n + 1, st


def test_sessions_keep_their_version_across_a_weight_change(srv, cartpole_checkpoint, cartpole_v2_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.5))
    ids = {"champion": checkpoint_id(cartpole_checkpoint), "candidate": checkpoint_id(cartpole_v2_checkpoint)}
    run = uuid.uuid4().hex[:8]
    sids = [f"sticky-{run}-{i}" for i in range(60)]
    # A session that the raised weight would now assign to the candidate must exist, or the test proves nothing.
    assert any(0.5 <= hash01(sid) < 0.9 for sid in sids)
    obs = cartpole_observations(3, seed=4)
    first: dict[str, str] = {}
    s = requests.Session()
    for sid in sids:
        for o in obs:
            r = act(srv, o, sid, s)
            first.setdefault(sid, r["version"])
            assert r["version"] == first[sid] and r["checkpoint_id"] == ids[r["version"]], (sid, r)
        # Assignment is the session id's hash against the weight: reproducible across replicas and restarts.
        assert first[sid] == ("candidate" if hash01(sid) < 0.5 else "champion"), sid
    assert stats(srv)["versions"]["candidate"]["active_sessions"] >= sum(v == "candidate" for v in first.values())

    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.9))
    assert info(srv)["candidate"]["weight"] == 0.9
    for sid in sids:
        for o in obs:
            r = act(srv, o, sid, s)
            assert r["version"] == first[sid], f"session {sid} changed version after the weight change: {r}"
    # New sessions follow the new weight.
    for i in range(30):
        sid = f"new-{run}-{i}"
        assert act(srv, obs[0], sid, s)["version"] == ("candidate" if hash01(sid) < 0.9 else "champion"), sid


def _episodes_metric(srv, version: str) -> float:
    return sum(v for _, v in metric_samples(scrape(srv.metrics_url), "ray_rl_serve_episodes_total",
                                            policy="default", version=version))


def _return_metric(srv, version: str) -> float | None:
    vals = [v for _, v in metric_samples(scrape(srv.metrics_url), "ray_rl_serve_episode_return_sum",
                                         policy="default", version=version)]
    return vals[0] if vals else None


def test_feedback_credits_episode_returns_to_the_version_that_acted(srv, cartpole_checkpoint, cartpole_v2_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.5))
    run = uuid.uuid4().hex[:8]
    # Two sessions per version, chosen by their hash (assignment is reproducible).
    by_role: dict[str, list[str]] = {"champion": [], "candidate": []}
    i = 0
    while min(len(v) for v in by_role.values()) < 2:
        sid = f"fb-{run}-{i}"
        role = "candidate" if hash01(sid) < 0.5 else "champion"
        if len(by_role[role]) < 2:
            by_role[role].append(sid)
        i += 1
    before = stats(srv)["versions"]
    m_before = {role: _return_metric(srv, role) or 0.0 for role in by_role}  # no episode ended earlier in the module
    for role, sids in by_role.items():
        for sid in sids:
            assert act(srv, [0.0, 0.0, 0.0, 0.0], sid)["version"] == role
    c1, c2 = by_role["champion"]
    k1, k2 = by_role["candidate"]
    # Single form: rewards accumulate, done ends the episode.
    for body in ({"session_id": c1, "reward": 1.0}, {"session_id": c1, "reward": 2}):
        r = feedback(srv, body)
        assert r.status_code == 200 and r.json() == {"accepted": 1, "episodes_ended": 0}, r.text
    r = feedback(srv, {"session_id": c1, "reward": 0.5, "done": True})
    assert r.json() == {"accepted": 1, "episodes_ended": 1}, r.text  # champion episode: 3.5
    # Batch form, several sessions of both versions.
    r = feedback(srv, {"feedback": [{"session_id": k1, "reward": 10.0}, {"session_id": k1, "reward": -1.0, "done": True},
                                    {"session_id": k2, "reward": 4.0, "done": True},
                                    {"session_id": c2, "reward": 1.5, "done": True}]})
    assert r.status_code == 200 and r.json() == {"accepted": 4, "episodes_ended": 3}, r.text
    after = stats(srv)["versions"]
    d = {role: {k: after[role][k] - before[role][k] for k in ("episodes", "return_sum", "return_sq_sum")}
         for role in ("champion", "candidate")}
    assert d["champion"] == {"episodes": 2, "return_sum": 5.0, "return_sq_sum": 3.5 ** 2 + 1.5 ** 2}, d
    assert d["candidate"] == {"episodes": 2, "return_sum": 13.0, "return_sq_sum": 9.0 ** 2 + 4.0 ** 2}, d
    # The same figures on Ray's metrics port (Prometheus sums replicas from these).
    wait_for(lambda: _return_metric(srv, "candidate") == m_before["candidate"] + 13.0
             and _return_metric(srv, "champion") == m_before["champion"] + 5.0
             and _episodes_metric(srv, "candidate") >= 2 and _episodes_metric(srv, "champion") >= 2, 90,
             "episode metrics per version", interval=1)
    ok = metric_samples(scrape(srv.metrics_url), "ray_rl_serve_feedback_total", policy="default", result="ok")
    assert ok and ok[0][1] >= 7, ok

    # Ended sessions: 409, naming the session; nothing of the batch is applied.
    r = feedback(srv, {"session_id": c1, "reward": 1.0})
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_ended" and c1 in r.json()["error"]["message"]
    r = feedback(srv, {"feedback": [{"session_id": k1, "reward": 1.0}]})
    assert r.status_code == 409 and k1 in r.json()["error"]["message"], r.text
    # A session that never acted: 404.
    r = feedback(srv, {"session_id": f"never-{run}", "reward": 1.0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session", r.text
    assert f"never-{run}" in r.json()["error"]["message"]
    # The whole batch is validated before any item is applied: the open session's reward is not counted.
    live = f"fb-{run}-live"
    act(srv, [0.0, 0.0, 0.0, 0.0], live)
    r = feedback(srv, {"feedback": [{"session_id": live, "reward": 100.0, "done": True},
                                    {"session_id": f"never-{run}", "reward": 1.0}]})
    assert r.status_code == 404 and "feedback[1]" in r.json()["error"]["message"], r.text
    r = feedback(srv, {"session_id": live, "reward": 1.0, "done": True})
    assert r.status_code == 200, r.text
    role = "candidate" if hash01(live) < 0.5 else "champion"
    assert stats(srv)["versions"][role]["return_sum"] == after[role]["return_sum"] + 1.0
    # A DELETEd session has ended too.
    gone = f"fb-{run}-gone"
    act(srv, [0.0, 0.0, 0.0, 0.0], gone)
    assert requests.delete(srv.base + f"/v1/policies/default/sessions/{gone}", timeout=10).json()["ended"] is True
    assert feedback(srv, {"session_id": gone, "reward": 1.0}).status_code == 409

    # A reload starts a version's /stats figures again; its return sums on the metrics port run on, like its episodes
    # counter, so a window's delta over a reload is still its episodes' returns (rl-rollout's Prometheus source, the
    # canary rules; CI saw a baseline scraped before a reload make a window's mean -271).
    total = m_before["candidate"] + 13.0 + (1.0 if role == "candidate" else 0.0)
    wait_for(lambda: _return_metric(srv, "candidate") == total, 90, "the live session's return", interval=1)
    apply(srv, spec(cartpole_v2_checkpoint, cartpole_checkpoint, 0.5))
    new_id = checkpoint_id(cartpole_checkpoint)
    wait_for(lambda: [v for _, v in metric_samples(scrape(srv.metrics_url), "ray_rl_serve_version_info",
                                                   policy="default", version="candidate", checkpoint_id=new_id)] == [1.0],
             90, "the reloaded candidate on the metrics port", interval=1)
    assert stats(srv)["versions"]["candidate"]["return_sum"] == 0.0
    assert _return_metric(srv, "candidate") == total, "the candidate's return sum was reset by the reload"


FEEDBACK_ERRORS = [
    ("nan", None, b'{"session_id": "s", "reward": NaN}', 422, "bad_reward", "reward"),
    ("infinity", None, b'{"session_id": "s", "reward": -Infinity}', 422, "bad_reward", "reward"),
    ("string", {"session_id": "s", "reward": "1.0"}, None, 422, "bad_reward", "reward"),
    ("bool", {"session_id": "s", "reward": True}, None, 422, "bad_reward", "reward"),
    ("huge-int", None, b'{"session_id": "s", "reward": 1' + b"0" * 400 + b"}", 422, "bad_reward", "reward"),
    ("missing-reward", {"session_id": "s"}, None, 400, "missing_reward", "reward"),
    ("missing-session", {"reward": 1.0}, None, 400, "missing_session_id", "session_id"),
    ("bad-session", {"session_id": "", "reward": 1.0}, None, 400, "bad_session_id", "session_id"),
    ("long-session", {"session_id": "x" * 129, "reward": 1.0}, None, 400, "bad_session_id", "session_id"),
    ("bad-done", {"session_id": "s", "reward": 1.0, "done": "yes"}, None, 422, "bad_done", "done"),
    ("unknown-field", {"session_id": "s", "reward": 1.0, "rewrad": 1}, None, 400, "unknown_field", "rewrad"),
    ("batch-not-list", {"feedback": {"session_id": "s"}}, None, 400, "bad_feedback", "feedback"),
    ("batch-item-not-object", {"feedback": [1]}, None, 400, "bad_feedback", "feedback[0]"),
    ("batch-bad-item", {"feedback": [{"session_id": "s", "reward": 1}, {"session_id": "s", "reward": "x"}]}, None,
     422, "bad_reward", "feedback[1].reward"),
    ("batch-empty", {"feedback": []}, None, 422, "empty_batch", "feedback"),
    ("batch-too-large", {"feedback": [{"session_id": "s", "reward": 1.0}] * (MAX_ITEMS + 1)}, None, 413,
     "batch_too_large", str(MAX_ITEMS)),
    ("batch-extra-field", {"feedback": [], "x": 1}, None, 400, "unknown_field", "x"),
]


@pytest.mark.parametrize("case", FEEDBACK_ERRORS, ids=[c[0] for c in FEEDBACK_ERRORS])
def test_bad_feedback_gets_its_4xx_naming_the_field(srv, case):
    _, body, raw, status, code, named = case
    r = feedback(srv, body, raw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and named in err["message"], err


def test_bad_candidate_weight_in_the_file_keeps_the_previous_config(srv, cartpole_checkpoint, cartpole_v2_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.2))
    for bad, named in ((1.5, "weight"), (-0.1, "weight"), ("x", "weight")):
        ev = apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, bad), expect="reload_failed")
        assert f"user_config.policies.default.candidate.{named} must be a number in [0, 1]" in ev["error"], ev
    ev = apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.5, mode="sideways"), expect="reload_failed")
    assert "candidate.mode must be one of" in ev["error"] and "sideways" in ev["error"], ev
    ev = apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.5, wieght=0.5), expect="reload_failed")
    assert "unknown keys ['wieght']" in ev["error"], ev
    cand = info(srv)["candidate"]
    assert cand["weight"] == 0.2 and cand["mode"] == "split", cand
    assert act(srv, [0.0, 0.0, 0.0, 0.0])["version"] in ("champion", "candidate")


def test_candidate_of_another_env_leaves_the_champion_serving(srv, cartpole_checkpoint, trading_checkpoint):
    apply(srv, cartpole_checkpoint)
    ev = apply(srv, spec(cartpole_checkpoint, trading_checkpoint, 0.5), expect="reload_failed")
    assert "candidate" in ev["error"] and "another env" in ev["error"], ev
    i = info(srv)
    assert i["checkpoint_id"] == checkpoint_id(cartpole_checkpoint) and i["candidate"] is None, i
    err = i["candidate_error"]
    assert err["checkpoint"] == trading_checkpoint and "observation space" in err["error"], err
    r = requests.get(srv.base + "/readyz", timeout=10)
    assert r.status_code == 200 and "another env" in r.json()["errors"]["default/candidate"], r.text
    s = requests.Session()
    for o in cartpole_observations(20, seed=5):
        r = act(srv, o, s=s)
        assert r["version"] == "champion" and r["checkpoint_id"] == checkpoint_id(cartpole_checkpoint), r
    assert "candidate" not in stats(srv)["versions"]
    apply(srv, cartpole_checkpoint)  # a config without the candidate clears the error
    assert "candidate_error" not in info(srv)
    assert "errors" not in requests.get(srv.base + "/readyz", timeout=10).json()


def test_candidate_that_cannot_load_leaves_the_champion_serving(srv, serving_workdir, cartpole_checkpoint,
                                                                cartpole_v2_checkpoint):
    """Passes the launcher's layout check, fails in the replica (weights file truncated)."""
    import shutil

    corrupt = serving_workdir / "corrupt_candidate"
    shutil.copytree(cartpole_v2_checkpoint, corrupt, dirs_exist_ok=True)
    (corrupt / "module_state.pkl").write_bytes(b"not a pickle")
    apply(srv, cartpole_checkpoint)
    ev = apply(srv, spec(cartpole_checkpoint, str(corrupt), 0.5), expect="reload_failed")
    assert "candidate did not load" in ev["error"] and "cannot load RLModule" in ev["error"], ev
    i = info(srv)
    assert i["candidate"] is None and "cannot load RLModule" in i["candidate_error"]["error"], i
    assert act(srv, [0.0, 0.0, 0.0, 0.0])["version"] == "champion"


def _version_requests(srv, version: str, result: str) -> float:
    return sum(v for _, v in metric_samples(scrape(srv.metrics_url), "ray_rl_serve_version_requests_total",
                                            policy="default", version=version, result=result))


def test_candidate_that_raises_is_answered_by_the_champion(srv, serving_workdir, cartpole_checkpoint):
    """A real module whose forward raises: no client sees it, each failure is counted, a session that met it stays
    on the champion."""
    import importlib

    faulty = importlib.import_module("tests.serving.faulty_modules")  # importable by the replica under this name
    bad = serving_workdir / "raising_candidate"
    if not bad.exists():
        faulty.faulty_checkpoint(bad, faulty.RaisingPPOModule)
    apply(srv, spec(cartpole_checkpoint, str(bad), 1.0))
    assert info(srv)["candidate"]["checkpoint_id"] == checkpoint_id(str(bad))
    errors_before = _version_requests(srv, "candidate", "error")
    champion_id = checkpoint_id(cartpole_checkpoint)
    s = requests.Session()
    run = uuid.uuid4().hex[:8]
    for sess in range(5):
        for step in range(4):
            r = act(srv, [0.01 * step, 0.0, 0.0, 0.0], f"raise-{run}-{sess}", s)
            assert r["version"] == "champion" and r["checkpoint_id"] == champion_id, r
    for o in cartpole_observations(10, seed=8):
        assert act(srv, o, s=s)["version"] == "champion"
    r = s.post(srv.base + "/v1/policies/default/act_batch", json={"observations": [[0.0] * 4] * 3}, timeout=30)
    assert r.status_code == 200 and r.json()["version"] == "champion", r.text
    st = stats(srv)["versions"]
    # One failure per session (then pinned), one per session-less request, one for the batch.
    assert st["candidate"]["errors"] == st["candidate"]["requests"] == 5 + 10 + 1, st["candidate"]
    assert st["candidate"]["active_sessions"] == 0 and st["champion"]["active_sessions"] >= 5
    wait_for(lambda: _version_requests(srv, "candidate", "error") >= errors_before + 16, 90,
             'ray_rl_serve_version_requests_total{version="candidate",result="error"}', interval=1)
    apply(srv, cartpole_checkpoint)


def _shadow(srv) -> dict:
    return stats(srv)["versions"]["candidate"]["shadow"]


def test_shadow_identical_candidate_agrees_and_never_answers(srv, cartpole_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_checkpoint, 1.0, mode="shadow"))
    st = stats(srv)["versions"]
    assert st["champion"]["weight"] == 1.0 and st["candidate"]["mode"] == "shadow"
    n = 120
    s = requests.Session()
    for i, o in enumerate(cartpole_observations(n, seed=6)):
        assert act(srv, o, f"sh-{i // 10}" if i % 2 else None, s)["version"] == "champion"
    sh = wait_for(lambda: (lambda x: x if x["compared"] + x["dropped"] + x["errors"] >= n else None)(_shadow(srv)),
                  30, "the shadow worker to compare every mirrored request")
    assert sh["compared"] > 0 and sh["agreed"] == sh["compared"] and sh["errors"] == 0, sh
    assert stats(srv)["versions"]["candidate"]["requests"] == 0  # it never answered
    wait_for(lambda: sum(v for _, v in metric_samples(scrape(srv.metrics_url), "ray_rl_serve_shadow_total",
                                                      policy="default", outcome="agree")) >= sh["agreed"], 90,
             "ray_rl_serve_shadow_total{outcome=agree}", interval=1)


def test_shadow_different_candidate_disagrees(srv, cartpole_checkpoint, cartpole_v2_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 1.0, mode="shadow"))
    obs = cartpole_observations(200, seed=7)
    s = requests.Session()
    for o in obs:
        assert act(srv, o, s=s)["checkpoint_id"] == checkpoint_id(cartpole_checkpoint)
    sh = wait_for(lambda: (lambda x: x if x["compared"] + x["dropped"] >= len(obs) else None)(_shadow(srv)),
                  30, "the shadow worker to compare every mirrored request")
    # What the two modules answer in process, on the same observations.
    from test_api import reference_actions

    differ = sum(a != b for a, b in zip(reference_actions(cartpole_checkpoint, obs),
                                        reference_actions(cartpole_v2_checkpoint, obs)))
    assert differ > 0
    assert sh["compared"] > 0 and sh["agreed"] < sh["compared"], sh
    if sh["dropped"] == 0:
        assert sh["compared"] - sh["agreed"] == differ, (sh, differ)


def test_changing_only_rollout_or_weight_reloads_nothing(srv, cartpole_checkpoint, cartpole_v2_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.1, rollout={"step": 0}))
    before, loads = info(srv), stats(srv)["loads"]
    assert stats(srv)["rollout"] == {"step": 0}
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.1, rollout={"step": 1, "history": ["x"]}))
    assert stats(srv)["rollout"] == {"step": 1, "history": ["x"]}  # applied...
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.6, mode="split", rollout={"step": 2}))
    after = info(srv)
    assert after["candidate"]["weight"] == 0.6 and stats(srv)["versions"]["candidate"]["weight"] == 0.6
    # ... without loading anything: no checkpoint load, the same loaded objects.
    assert stats(srv)["loads"] == loads
    assert after["loaded_at"] == before["loaded_at"]
    assert after["candidate"]["loaded_at"] == before["candidate"]["loaded_at"]
    # A new candidate checkpoint is one load.
    apply(srv, spec(cartpole_checkpoint, cartpole_checkpoint, 0.6, rollout={"step": 2}))
    assert stats(srv)["loads"] == loads + 1


def test_promote_reuses_the_candidate_without_a_failed_request(srv, cartpole_checkpoint, cartpole_v2_checkpoint):
    apply(srv, spec(cartpole_checkpoint, cartpole_v2_checkpoint, 0.5))
    cand_loaded = info(srv)["candidate"]["loaded_at"]
    ids = {"champion": checkpoint_id(cartpole_checkpoint), "candidate": checkpoint_id(cartpole_v2_checkpoint)}
    seen: list[tuple] = []  # (client, session, status or error, version, checkpoint_id)
    stop = threading.Event()
    run = uuid.uuid4().hex[:8]

    def client(c: int):
        s = requests.Session()
        ep = 0
        while not stop.is_set():
            sid = f"promo-{run}-{c}-{ep}"
            for step in range(10):
                try:
                    r = s.post(srv.base + "/v1/policies/default/act",
                               json={"observation": [0.01 * step, 0.0, 0.0, 0.0], "session_id": sid}, timeout=30)
                    b = r.json()
                    seen.append((c, sid, r.status_code, b.get("version"), b.get("checkpoint_id")))
                except (requests.RequestException, ValueError) as e:
                    seen.append((c, sid, f"{type(e).__name__}: {e}", None, None))
            ep += 1

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(seen) >= 60, 60, "traffic before the promotion")
        apply(srv, cartpole_v2_checkpoint)  # champion := the candidate's checkpoint, no candidate
        n = len(seen)
        wait_for(lambda: len(seen) >= n + 60, 60, "traffic after the promotion")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    failed = [x for x in seen if x[2] != 200]
    assert not failed, f"{len(failed)} of {len(seen)} requests failed around the promotion: {failed[:5]}"
    i = info(srv)
    assert i["checkpoint_id"] == ids["candidate"] and i["candidate"] is None, i
    assert i["loaded_at"] == cand_loaded, "the promoted candidate was loaded again instead of reused"
    # A session that started on the candidate kept its checkpoint through the promotion.
    per_session: dict[str, set] = {}
    for _, sid, _, _, cid in seen:
        per_session.setdefault(sid, set()).add(cid)
    on_cand = [sid for sid, cids in per_session.items() if ids["candidate"] in cids]
    assert on_cand and all(per_session[sid] == {ids["candidate"]} for sid in on_cand
                           if hash01(sid) < 0.5), {s: per_session[s] for s in on_cand[:5]}
    assert seen[-1][3:] == ("champion", ids["candidate"])


# ------------------------------------------------------------------------------------------- in process


def _run(coro):
    import asyncio

    return asyncio.run(coro)


async def _direct() -> bool:
    return False


def _versions(champion: str, cand: str | None, weight: float, mode: str = "split"):
    """A PolicyVersions serving real checkpoints, configured like reconfigure does (no Serve, no HTTP)."""
    from serving.metrics import ServerMetrics
    from serving.versions import PolicyVersions, load_versions

    cfg = ServerConfig.parse({"policies": {"p": spec(champion, cand, weight, mode)}})
    metrics = ServerMetrics()
    vs = PolicyVersions("p", metrics, cfg.limits, 32, 0.0)
    loaded = _run(load_versions("p", champion, cfg.candidates.get("p"), None, cfg.limits, "/tmp", metrics))
    vs.apply(loaded, cfg.limits)
    return vs


def _reconfigure(vs, champion: str, cand: str | None, weight: float, mode: str = "split"):
    from serving.versions import load_versions

    cfg = ServerConfig.parse({"policies": {"p": spec(champion, cand, weight, mode)}})
    loaded = _run(load_versions("p", champion, cfg.candidates.get("p"), vs, cfg.limits, "/tmp", vs.metrics))
    return loaded, vs.apply(loaded, cfg.limits)


@pytest.fixture(scope="module")
def local_ray():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _broken(pol, other):
    """`pol` with the forward pass of another env's module: real modules, a real shape error at act time."""
    import dataclasses

    return dataclasses.replace(pol, inference=other.inference)


def test_a_candidate_that_raises_falls_back_to_the_champion_and_pins_the_session(local_ray, cartpole_checkpoint,
                                                                              cartpole_v2_checkpoint,
                                                                              trading_checkpoint):
    from serving.policy import LoadedPolicy
    from serving.versions import Failed

    vs = _versions(cartpole_checkpoint, cartpole_v2_checkpoint, 1.0)
    trading = LoadedPolicy.load("t", trading_checkpoint)
    vs.candidate.pol = _broken(vs.candidate.pol, trading)
    obs = np.zeros(4, np.float32)
    # The batcher: one version's exception fails only its own items.
    out = vs.batcher.forward([(vs.champion.pol, obs), (vs.candidate.pol, obs), (vs.champion.pol, obs)])
    assert out[0] in (0, 1) and out[2] == out[0] and type(out[1]) is Failed, out
    r = _run(vs.act({"observation": obs.tolist(), "session_id": "pinned"}, time.perf_counter(), _direct))
    assert r["version"] == "champion" and r["checkpoint_id"] == checkpoint_id(cartpole_checkpoint), r
    st = vs.stats("test")["versions"]
    assert st["candidate"]["errors"] == 1 and st["candidate"]["requests"] == 1 and st["champion"]["requests"] == 1
    # The session stays on the champion: the candidate is not tried again for it.
    r = _run(vs.act({"observation": obs.tolist(), "session_id": "pinned"}, time.perf_counter(), _direct))
    assert r["version"] == "champion" and vs.stats("test")["versions"]["candidate"]["errors"] == 1
    # Session-less requests (weight 1.0) try the candidate each time and fall back each time.
    r = vs.act_batch({"observations": [obs.tolist()] * 3}, time.perf_counter())
    assert r["version"] == "champion" and len(r["actions"]) == 3
    assert vs.stats("test")["versions"]["candidate"]["errors"] == 2
    # Feedback of the pinned session counts for the champion.
    assert vs.feedback({"session_id": "pinned", "reward": 2.0, "done": True}, 8)["episodes_ended"] == 1
    assert vs.stats("test")["versions"]["champion"]["episodes"] == 1


def test_frame_stacks_follow_the_session_version_and_survive_a_promotion(local_ray, serving_workdir):
    from make_checkpoint import make_module_checkpoint

    a = str(make_module_checkpoint(serving_workdir / "pong_a", "pong", seed=0))
    b = str(make_module_checkpoint(serving_workdir / "pong_b", "pong", seed=1))
    vs = _versions(a, b, 0.5)
    sids = [f"game-{i}" for i in range(12)]
    roles = {sid: ("candidate" if hash01(sid) < 0.5 else "champion") for sid in sids}
    assert set(roles.values()) == {"champion", "candidate"}
    frame = np.zeros((64, 64, 1), np.float32).tolist()
    for t in range(3):
        for sid in sids:
            r = _run(vs.act({"session_id": sid, "frame": frame, **({"reset": True} if t == 0 else {})},
                            time.perf_counter(), _direct))
            assert r["version"] == roles[sid] and r["session"] == {"id": sid, "new": t == 0, "frames": t + 1}, r
    # Each version holds the stacks of its own sessions only.
    assert len(vs.champion.pol.sessions) == sum(r == "champion" for r in roles.values())
    assert len(vs.candidate.pol.sessions) == sum(r == "candidate" for r in roles.values())
    cand_pol = vs.candidate.pol
    loaded, released = _reconfigure(vs, b, None, 0.0)  # promote
    assert loaded.champion is cand_pol and vs.champion.pol is cand_pol and vs.candidate is None
    assert [p.checkpoint for p in released] == [a]
    for sid in sids:  # every session keeps its frames (the former champion's sessions moved over)
        r = _run(vs.act({"session_id": sid, "frame": frame}, time.perf_counter(), _direct))
        assert r["version"] == "champion" and r["session"] == {"id": sid, "new": False, "frames": 4}, r


def test_shadow_worker_keeps_its_own_frame_stacks_and_agrees_with_an_identical_candidate(local_ray, serving_workdir):
    from make_checkpoint import make_module_checkpoint

    a = str(make_module_checkpoint(serving_workdir / "pong_shadow", "pong", seed=2))
    vs = _versions(a, a, 1.0, mode="shadow")
    assert vs.candidate.pol is not vs.champion.pol  # its own object, its own stacks
    rng = np.random.default_rng(0)
    n = 0
    for g in range(3):
        for t in range(6):
            frame = rng.uniform(-1, 1, size=(64, 64, 1)).astype(np.float32).tolist()
            r = _run(vs.act({"session_id": f"g{g}", "frame": frame, **({"reset": True} if t == 0 else {})},
                            time.perf_counter(), _direct))
            assert r["version"] == "champion"
            n += 1
    sh = wait_for(lambda: (lambda x: x if x["compared"] + x["dropped"] >= n else None)(
        vs.stats("t")["versions"]["candidate"]["shadow"]), 30, "shadow comparisons")
    assert sh["compared"] == n and sh["agreed"] == n, sh
    assert len(vs.candidate.pol.sessions) == 3
    vs.stop()


def test_session_table_is_bounded_and_remembers_ended_sessions(monkeypatch):
    """LRU + idle expiry forget a session (feedback: 404), an ended one is remembered (409)."""
    import types

    import serving.versions as versions

    now = [1000.0]
    monkeypatch.setattr(versions, "time", types.SimpleNamespace(monotonic=lambda: now[0],
                                                                perf_counter=time.perf_counter, time=time.time))
    table = versions.Assignments(max_sessions=2, ttl_s=60)
    role = {"a": "candidate", "b": "champion", "c": "champion"}
    choose = lambda sid: (role[sid], False)  # noqa: E731
    assert table.open("a", choose)[1] is True and table.open("b", choose)[1] is True
    assert table.counts == {"champion": 1, "candidate": 1}
    now[0] += 1
    assert table.open("a", choose)[1] is False  # "a" is now the most recent
    table.open("c", choose)  # over the bound: "b" (least recently used) is forgotten, not ended
    assert table.get("b") is None and not table.was_ended("b") and table.get("a").role == "candidate"
    assert table.end("a") is not None and table.was_ended("a") and table.get("a") is None
    assert table.counts == {"champion": 1, "candidate": 0}
    now[0] += 61  # "c" idle beyond the ttl
    assert table.get("c") is None and not table.was_ended("c") and table.counts == {"champion": 0, "candidate": 0}
    assert table.open("a", choose)[1] is True and not table.was_ended("a")  # a new episode under the same id


def test_no_watch_flag():
    from serving.__main__ import parse_args

    assert parse_args([]).watch is True and parse_args(["--no-watch"]).watch is False
