"""Transition logging (user_config.log) against a real `python -m serving`: episodes played over HTTP with
per-step feedback come back as Parquet rows in RLlib's offline format; sampling keeps whole sessions; a store
outage and a full buffer cost rows (counted), never requests; bad feedback and a bad `log` config are refused."""

from __future__ import annotations

import importlib.util
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import requests

from conftest import REPO, ServerProcess, metric_samples, scrape
from serving.transitions import SCHEMA_VERSION, sampled

pytestmark = pytest.mark.serve

COLUMNS = ["eps_id", "agent_id", "module_id", "obs", "new_obs", "actions", "rewards", "terminateds", "truncateds",
           "t", "action_logp", "policy", "version", "checkpoint_id", "session_id", "time"]
FAST = {"flush_interval_s": 0.2, "retry_s": 0.3}  # files within a fraction of a second, retries as often


def _forwarder():
    # The trainer's outage test owns the TCP forwarder it cuts; loaded from its file (tests/trainer is no package).
    spec = importlib.util.spec_from_file_location("storage_outage", REPO / "tests/trainer/test_storage_outage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Forwarder


@pytest.fixture(scope="module")
def log_server(s3, serving_workdir, cartpole_v2_checkpoint, pong_checkpoint):
    # `s3` first: the replica's writer reaches the local S3 server with the credentials it puts in the env.
    work = serving_workdir / "tlog_server"
    work.mkdir()
    srv = ServerProcess(work, {"default": cartpole_v2_checkpoint, "pong": pong_checkpoint},
                        log={"uri": str(work / "log-a"), **FAST})
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited {rc} on SIGINT:\n{srv.log_tail()}"


# ------------------------------------------------------------------------------------------------ helpers


def set_log(srv: ServerProcess, **log) -> None:
    srv.user_config["log"] = log
    srv.reload(srv.policies)


def post(s: requests.Session, srv: ServerProcess, path: str, body: dict) -> dict:
    r = s.post(f"{srv.base}/v1/policies/default/{path}", json=body, timeout=30)
    assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
    return r.json()


def play(srv: ServerProcess, sid: str, seed: int, max_steps: int = 500, s: requests.Session | None = None) -> dict:
    """One CartPole episode in session `sid`: an act per step, the step's reward as feedback, and done (with
    truncated and the final observation) at the end. -> what was sent and answered."""
    import gymnasium as gym

    s = s or requests.Session()
    env = gym.make("CartPole-v1", max_episode_steps=max_steps)
    obs, _ = env.reset(seed=seed)
    sent, actions, rewards = [], [], []
    while True:
        out = post(s, srv, "act", {"observation": obs.tolist(), "session_id": sid})
        sent.append(obs)
        actions.append(out["action"])
        obs, reward, term, trunc, _ = env.step(out["action"])
        rewards.append(float(reward))
        if term or trunc:
            post(s, srv, "feedback", {"session_id": sid, "reward": reward, "done": True, "truncated": bool(trunc),
                                      "observation": obs.tolist()})
            env.close()
            return {"obs": sent, "actions": actions, "rewards": rewards, "final": obs, "truncated": bool(trunc),
                    "checkpoint_id": out["checkpoint_id"]}
        post(s, srv, "feedback", {"session_id": sid, "reward": reward})


def local_rows(root: Path, policy: str = "default") -> list[dict]:
    files = sorted((root / policy).glob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def s3_rows(s3, prefix: str, policy: str = "default") -> list[dict]:
    sel = pafs.FileSelector(f"{s3.BUCKET}/{prefix}/{policy}", allow_not_found=True)
    files = [i.path for i in s3.fs.get_file_info(sel) if i.path.endswith(".parquet")]
    return [row for f in files for row in pq.read_table(f, filesystem=s3.fs).to_pylist()]


def by_session(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["session_id"], []).append(r)
    return {k: sorted(v, key=lambda r: r["t"]) for k, v in out.items()}


def wait_for(what: str, cond, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.2)


def wait_rows(what: str, rows, want: dict[str, int], timeout_s: float = 60) -> dict[str, list[dict]]:
    """Rows by session once every session in `want` has at least its number of rows (they may span files)."""
    def complete():
        got = by_session(rows())
        return got if all(len(got.get(sid, ())) >= n for sid, n in want.items()) else None
    return wait_for(what, complete, timeout_s)


def replica_log(srv: ServerProcess) -> str:
    logs = (srv.workdir / "ray").glob("session_*/logs/serve/replica_*.log")
    return "".join(p.read_text(errors="replace") for p in logs)


def counter(srv: ServerProcess, name: str, **labels: str) -> float:
    return sum(v for _, v in metric_samples(scrape(srv.metrics_url), name, policy="default", **labels))


def sid_for(rate: float, logged: bool) -> str:
    while True:
        sid = f"probe-{uuid.uuid4().hex[:10]}"
        if sampled(sid, rate) == logged:
            return sid


def applied(srv: ServerProcess, rows, rate: float = 1.0) -> None:
    """Wait until the replica logs with the config just reloaded: a probe episode shows up where it now writes."""
    sid = sid_for(rate, True)
    play(srv, sid, seed=0, max_steps=3)
    wait_for(f"the probe session {sid} in the new log location", lambda: sid in by_session(rows()))


def assert_episode(rows: list[dict], ep: dict) -> None:
    n = len(ep["obs"])
    assert [r["t"] for r in rows] == list(range(n)), [r["t"] for r in rows]
    assert len({r["eps_id"] for r in rows}) == 1
    np.testing.assert_allclose([r["obs"] for r in rows], np.stack(ep["obs"]), rtol=1e-6)
    np.testing.assert_allclose([r["new_obs"] for r in rows], np.stack([*ep["obs"][1:], ep["final"]]), rtol=1e-6)
    assert [r["actions"] for r in rows] == ep["actions"]
    assert [r["rewards"] for r in rows] == ep["rewards"]
    assert [r["terminateds"] for r in rows] == [False] * (n - 1) + [not ep["truncated"]]
    assert [r["truncateds"] for r in rows] == [False] * (n - 1) + [ep["truncated"]]
    assert {(r["policy"], r["version"], r["checkpoint_id"], r["action_logp"], r["agent_id"], r["module_id"])
            for r in rows} == {("default", "champion", ep["checkpoint_id"], 0.0, None, None)}
    times = [r["time"] for r in rows]
    assert times == sorted(times) and abs(times[0] - time.time()) < 600, times


# ------------------------------------------------------------------------------------------------ tests


def test_episodes_are_logged_as_rllib_offline_rows(log_server, tmp_path):
    srv = log_server
    root = srv.workdir / "log-a"
    episodes = {}
    for i in range(4):  # the 4th is cut short by a time limit: truncated, not terminated
        sid = f"ep-{i}-{uuid.uuid4().hex[:6]}"
        episodes[sid] = play(srv, sid, seed=i, max_steps=8 if i == 3 else 500)
    assert episodes[sid]["truncated"]
    # A session left mid-episode (DELETE) and one restarted with reset=true: their last step is truncated.
    s = requests.Session()
    obs = [[0.01, 0.0, 0.0, 0.0], [0.02, 0.0, 0.0, 0.0]]
    for o in obs:
        post(s, srv, "act", {"observation": o, "session_id": "left"})
    assert s.delete(f"{srv.base}/v1/policies/default/sessions/left", timeout=30).json()["ended"]
    post(s, srv, "act", {"observation": obs[0], "session_id": "restarted"})
    post(s, srv, "act", {"observation": obs[1], "session_id": "restarted", "reset": True})
    post(s, srv, "feedback", {"session_id": "restarted", "reward": 2.5, "done": True})
    # A frame-stacked policy logs the single (preprocessed) frames the env produces, not the stack.
    pong = requests.get(f"{srv.base}/v1/policies/pong", timeout=10).json()
    shape = pong["frame"]["shape"]
    for v in (0.1, 0.2):
        r = s.post(f"{srv.base}/v1/policies/pong/act", timeout=30,
                   json={"frame": np.full(shape, v).tolist(), "session_id": "pong-1"})
        assert r.status_code == 200, r.text
    r = s.post(f"{srv.base}/v1/policies/pong/feedback", timeout=30,
               json={"session_id": "pong-1", "reward": 1.0, "done": True, "observation": np.full(shape, 0.3).tolist()})
    assert r.status_code == 200, r.text

    want = {sid: len(ep["obs"]) for sid, ep in episodes.items()} | {"left": 2, "restarted": 2}
    got = wait_rows("every played session in the log", lambda: local_rows(root), want)
    for sid, ep in episodes.items():
        assert_episode(got[sid], ep)
    assert len({got[sid][0]["eps_id"] for sid in episodes}) == len(episodes), "eps_id must differ per episode"
    left = got["left"]
    assert [(r["t"], r["terminateds"], r["truncateds"]) for r in left] == [(0, False, False), (1, False, True)]
    assert left[1]["new_obs"] == pytest.approx(obs[1]) and left[0]["new_obs"] == pytest.approx(obs[1])
    restarted = got["restarted"]
    assert [(r["t"], r["terminateds"], r["truncateds"], r["rewards"]) for r in restarted] == \
        [(0, False, True, 0.0), (0, True, False, 2.5)]
    assert restarted[0]["eps_id"] != restarted[1]["eps_id"], "reset=true starts a new episode"
    pong_rows = wait_rows("the pong session", lambda: local_rows(root, "pong"), {"pong-1": 2})["pong-1"]
    assert [np.asarray(r["obs"]).shape for r in pong_rows] == [tuple(shape)] * 2
    assert np.asarray(pong_rows[1]["new_obs"]) == pytest.approx(np.full(shape, 0.3))
    assert np.asarray(pong_rows[0]["obs"]) == pytest.approx(np.full(shape, 0.1))
    assert np.asarray(pong_rows[0]["new_obs"]) == pytest.approx(np.full(shape, 0.2))
    assert [(r["terminateds"], r["rewards"]) for r in pong_rows] == [(False, 0.0), (True, 1.0)]

    f = next((root / "default").glob("*.parquet"))
    meta = pq.read_schema(f).metadata
    assert meta[b"schema_version"] == str(SCHEMA_VERSION).encode()
    types = {field.name: str(field.type) for field in pq.read_schema(f)}
    assert list(types) == COLUMNS
    assert (types["obs"], types["actions"], types["rewards"], types["t"], types["action_logp"], types["time"]) == \
        ("list<element: float>", "int64", "double", "int64", "float", "double")
    # Ray exports a replica's metrics every few seconds: wait for the export that counts every row, not the first.
    played = sum(len(e["obs"]) for e in episodes.values())
    wait_for(f"log_rows_total{{result=written}} >= {played}", lambda: counter(
        srv, "ray_rl_serve_log_rows_total", result="written") >= played)

    # Readable as they are by Ray Data, and mapped to episodes by RLlib's OfflinePreLearner.
    import types as pytypes

    import gymnasium as gym
    import ray
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp_path.parent / "ray"))
    try:
        ds = ray.data.read_parquet(str(root / "default"))
        assert ds.count() == sum(len(v) for v in by_session(local_rows(root)).values())
        assert set(ds.schema().names) == set(COLUMNS)
        everything = ds.take_batch(10_000, batch_format="numpy")
        mine = everything["session_id"] == sid
        batch = {k: v[mine] for k, v in everything.items()}
        cfg = BCConfig().environment(observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                     action_space=gym.spaces.Discrete(2))
        # _map_to_episodes reads only `config` from the prelearner (building one needs a Learner).
        eps = OfflinePreLearner._map_to_episodes(pytypes.SimpleNamespace(config=cfg), batch)["episodes"]
        assert len(eps) == len(episodes[sid]["obs"])
        assert sorted(int(e.get_actions()[0]) for e in eps) == sorted(episodes[sid]["actions"])
        assert sum(e.is_truncated for e in eps) == 1 and not any(e.is_terminated for e in eps)
    finally:
        ray.shutdown()


def test_feedback_fields_for_the_log_are_validated(log_server):
    srv = log_server
    s = requests.Session()
    post(s, srv, "act", {"observation": [0.0, 0.0, 0.0, 0.0], "session_id": "bad-fb"})
    cases = [({"session_id": "bad-fb", "reward": 1.0, "done": True, "truncated": "yes"}, 422, "bad_truncated"),
             ({"session_id": "bad-fb", "reward": 1.0, "truncated": True}, 422, "bad_truncated"),
             ({"session_id": "bad-fb", "reward": 1.0, "observation": [0.0] * 4}, 422, "bad_observation"),
             ({"session_id": "bad-fb", "reward": 1.0, "done": True, "observation": None}, 422, "bad_observation"),
             ({"session_id": "bad-fb", "reward": 1.0, "done": True, "observation": [0.0] * 3}, 422, "bad_shape"),
             ({"session_id": "bad-fb", "reward": 1.0, "done": True, "observation": ["a"] * 4}, 422, "bad_dtype"),
             ({"session_id": "bad-fb", "reward": 1.0, "done": True, "final": [0.0] * 4}, 400, "unknown_field")]
    for body, status, code in cases:
        r = s.post(f"{srv.base}/v1/policies/default/feedback", json=body, timeout=30)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (body, r.text)
        assert "observation" not in code or "observation" in r.json()["error"]["message"], r.text
    # Nothing was applied: the session is still open and ends normally.
    assert post(s, srv, "feedback", {"session_id": "bad-fb", "reward": 1.0, "done": True})["episodes_ended"] == 1


def test_sample_rate_logs_whole_sessions(log_server):
    srv = log_server
    root = srv.workdir / "log-sampled"
    set_log(srv, uri=str(root), sample_rate=0.5, **FAST)
    applied(srv, lambda: local_rows(root), rate=0.5)
    sids = [f"s-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
    plays = {sid: play(srv, sid, seed=100 + i, max_steps=6) for i, sid in enumerate(sids)}
    want = {sid for sid in sids if sampled(sid, 0.5)}
    assert 0 < len(want) < len(sids), "the draw should split 24 sessions"
    got = wait_rows("the sampled sessions", lambda: local_rows(root), {sid: len(plays[sid]["obs"]) for sid in want})
    assert want == set(got) & set(sids), "exactly the sampled sessions are logged"
    for sid in want:
        assert_episode(got[sid], plays[sid])  # whole: every step of a logged session


def test_full_buffer_drops_rows_and_requests_do_not_notice(log_server):
    srv = log_server
    root = srv.workdir / "log-full"
    dropped_before = counter(srv, "ray_rl_serve_log_rows_total", result="dropped")
    set_log(srv, uri=str(root), max_buffer=5, flush_rows=10**6, flush_interval_s=3600)  # no write: it fills
    s = requests.Session()
    # Episodes until the replica drops (the new config applies); each request is answered 200 (post asserts).
    wait_for("a dropped row", lambda: play(srv, f"fill-{uuid.uuid4().hex[:6]}", seed=0, max_steps=10, s=s) and (
        counter(srv, "ray_rl_serve_log_rows_total", result="dropped") > dropped_before))
    before = counter(srv, "ray_rl_serve_log_rows_total", result="dropped")
    steps = sum(len(play(srv, f"full-{i}", seed=i, max_steps=10, s=s)["obs"]) for i in range(4))
    wait_for("every row of a full buffer dropped", lambda: counter(
        srv, "ray_rl_serve_log_rows_total", result="dropped") - before >= steps)
    assert not local_rows(root), "written with flush_rows and flush_interval_s out of reach?"
    set_log(srv, uri=str(root), **FAST)  # the replaced log writes the rows it held, no more than max_buffer
    rows = wait_for("the buffered rows", lambda: local_rows(root) or None)
    assert len(rows) == 5, len(rows)


def test_store_outage_costs_no_request_and_recovers(log_server, s3):
    srv = log_server
    fwd = _forwarder()(s3.port)
    prefix = f"tlog-{uuid.uuid4().hex[:6]}"
    set_log(srv, uri=f"s3://{s3.BUCKET}/{prefix}?endpoint_override=127.0.0.1:{fwd.port}&scheme=http", **FAST)
    applied(srv, lambda: s3_rows(s3, prefix))
    failed_before = counter(srv, "ray_rl_serve_log_files_total", result="failed")
    written_before = counter(srv, "ray_rl_serve_log_rows_total", result="written")
    fwd.cut()
    try:
        s = requests.Session()
        during = {f"outage-{i}": play(srv, f"outage-{i}", seed=i, max_steps=20, s=s) for i in range(3)}
        wait_for("log_files_total{result=failed}", lambda: counter(
            srv, "ray_rl_serve_log_files_total", result="failed") > failed_before, timeout_s=120)
        for sid in during:
            assert sid not in by_session(s3_rows(s3, prefix)), "written while the store was cut off?"
        during["outage-3"] = play(srv, "outage-3", seed=3, max_steps=20, s=s)  # still answered
    finally:
        fwd.restore()
    got = wait_rows("the outage's rows after the store came back", lambda: s3_rows(s3, prefix),
                    {sid: len(ep["obs"]) for sid, ep in during.items()}, timeout_s=120)
    for sid, ep in during.items():
        assert_episode(got[sid], ep)
    rows = sum(len(e["obs"]) for e in during.values())
    wait_for("log_rows_total{result=written} after the outage", lambda: counter(
        srv, "ray_rl_serve_log_rows_total", result="written") - written_before >= rows)
    lines = set(replica_log(srv).splitlines())  # a set: Serve's replica log file can hold a record twice
    assert sum("transition log: cannot write" in line for line in lines) == 1, "an outage is logged once"


def test_bad_log_config_is_refused_naming_the_key(log_server):
    srv = log_server
    good = dict(srv.user_config["log"])
    for bad, key in (({**good, "sample_rate": 1.5}, "user_config.log.sample_rate"),
                     ({**good, "max_buffer": 0}, "user_config.log.max_buffer"),
                     ({**good, "flush_every": 3}, "user_config.log: unknown keys ['flush_every']")):
        srv.user_config["log"] = bad
        srv.write_config(srv.policies)
        srv.proc.send_signal(signal.SIGHUP)
        ev = srv.wait_event("reload_failed", 60)
        assert key in ev["error"], ev
    srv.user_config["log"] = good
    s = requests.Session()
    assert play(srv, "after-bad-config", seed=1, max_steps=5, s=s)["actions"]
