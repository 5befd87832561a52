"""The data flywheel end to end: serve a solved CartPole policy with transition logging on, play ~20k
transitions through the HTTP API with per-step feedback, train BC from the log with the real trainer (which
evaluates, registers and hands the version to the gate like an online run), require the BC policy's greedy
evaluation (rl-eval, 20 seeded episodes) to reach 450, and rank the solved policy above a 1-iteration one by
off-policy estimates on the same log (`rl-eval --offline`, recorded in the registry)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import pyarrow.parquet as pq
import pytest
import requests

from conftest import REPO, ServerProcess, subprocess_env

pytestmark = [pytest.mark.serve, pytest.mark.slow]

TRANSITIONS, CLIENTS = 20_000, 4  # ~40 episodes of the solved policy (up to 500 steps each)


def play_episodes(base: str, transitions: int, clients: int) -> tuple[int, int, list[str]]:
    """Seeded CartPole episodes over HTTP, `clients` at a time, until `transitions` steps were played (episodes
    started before then finish): an act per step, the step's reward as feedback, done (with truncated and the
    final observation) at the end. -> (steps played, episodes, failures)."""
    import itertools

    import gymnasium as gym

    url = f"{base}/v1/policies/default"
    seeds = itertools.count()
    lock = threading.Lock()
    steps, failures = [0, 0], []

    def client() -> None:
        s = requests.Session()
        env = gym.make("CartPole-v1")
        try:
            while True:
                with lock:
                    if steps[0] >= transitions or failures:
                        return
                    seed = next(seeds)
                sid, (obs, _) = f"flywheel-{uuid.uuid4().hex[:10]}", env.reset(seed=seed)
                n = 0
                while True:
                    r = s.post(f"{url}/act", json={"observation": obs.tolist(), "session_id": sid}, timeout=30)
                    if r.status_code != 200:
                        raise AssertionError(f"act: {r.status_code} {r.text[:200]}")
                    obs, reward, term, trunc, _ = env.step(r.json()["action"])
                    n += 1
                    body = {"session_id": sid, "reward": float(reward)}
                    if term or trunc:
                        body.update(done=True, truncated=bool(trunc), observation=obs.tolist())
                    r = s.post(f"{url}/feedback", json=body, timeout=30)
                    if r.status_code != 200:
                        raise AssertionError(f"feedback: {r.status_code} {r.text[:200]}")
                    if term or trunc:
                        break
                with lock:
                    steps[0] += n
                    steps[1] += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            with lock:
                failures.append(f"{type(e).__name__}: {e}")
        finally:
            env.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a client did not finish in 10 minutes"
    return steps[0], steps[1], failures


def run(*cmd: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def rl_eval(*args: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "rl_eval", *args, timeout=300)


def rl_policy(registry, *args: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "rl_checkpoint.policy_cli", "--registry", str(registry), *args, timeout=120)


def test_bc_from_the_served_policys_log_reaches_450_and_estimates_rank_the_solved_policy_first(
        serving_workdir, solved_cartpole, cartpole_checkpoint):
    expert = solved_cartpole  # greedy 500 on 20 episodes (conftest.py): the policy to serve and imitate
    t0 = time.monotonic()
    work = serving_workdir / "flywheel"
    work.mkdir()
    log = work / "log"

    # 1. Serve the solved policy with logging on; play through the API; the log holds every transition.
    srv = ServerProcess(work, {"default": expert},
                        log={"uri": str(log), "max_buffer": 50_000, "flush_interval_s": 1.0})
    try:
        t_play = time.monotonic()
        steps, episodes, failures = play_episodes(srv.base, TRANSITIONS, CLIENTS)
        play_s = time.monotonic() - t_play
        assert not failures, failures[:5]
    finally:
        rc = srv.stop()  # flushes what the writer still holds
    assert rc == 0, srv.log_tail()
    files = sorted((log / "default").glob("*.parquet"))
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    assert steps >= TRANSITIONS and rows == steps, (steps, rows)

    # 2. BC from the log through the real trainer: greedy evaluation while training, then rl-eval + registry.
    registry = work / "registry"
    t_train = time.monotonic()
    proc = run(sys.executable, "-m", "trainer", "~experiment", "algo=bc", "env=cartpole", f"offline.input={log}",
               f"output_dir={work / 'bc'}", "stop.eval_return_mean=500", "stop.iterations=12", "evaluation.interval=2",
               "seed=1", f"registry.root={registry}", "registry.name=cartpole", "registry.eval_episodes=20",
               f"resources.ray_tmp_dir={work / 'ray_bc'}")
    train_s = time.monotonic() - t_train
    assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["registered"]["version"] == 1 and summary["experiment"] == "cartpole_bc"
    # Offline env steps: transitions trained on, a whole number of updates of algo.train_batch_size.
    assert summary["env_steps"] == summary["iterations"] * 512 * 50

    bc = json.loads(rl_policy(registry, "show", "cartpole@1", "--json").stdout)
    ev = bc["eval"][-1]
    assert ev["episodes"] == 20 and ev["mean"] >= 450, ev
    # The gate judges the BC version like any other: no champion yet, so only its CI floor (475) can refuse it.
    gate = rl_policy(registry, "promote", "cartpole", "1", "--dry-run")
    assert gate.returncode == (0 if ev["ci95"][0] >= 475 else 2), gate.stdout + gate.stderr
    assert ("passed" if ev["ci95"][0] >= 475 else "rule min_return") in gate.stdout

    # 3. Off-policy estimates on the same log rank the solved policy above a 1-iteration one, in the registry.
    assert rl_policy(registry, "register", "cartpole", expert).returncode == 0  # v2
    assert rl_policy(registry, "register", "cartpole", cartpole_checkpoint).returncode == 0  # v3
    figures = {}
    for version in (1, 2, 3):
        out = rl_eval(f"registry:{registry}/cartpole@{version}", "--offline", str(log), "--json")
        assert out.returncode == 0, out.stderr[-2000:]
        figures[version] = json.loads(out.stdout.strip().splitlines()[-1])
        assert figures[version]["episodes"] == episodes and figures[version]["transitions"] == steps
    solved, weak = figures[2], figures[3]
    assert solved["agreement"] > 0.99 and solved["ci95"][0] > weak["ci95"][1], (solved["ci95"], weak["ci95"])
    recorded = json.loads(rl_policy(registry, "show", "cartpole@2", "--json").stdout)["offline_estimates"]
    assert [e["estimate_id"] for e in recorded] == [solved["estimate_id"]]
    print(f"\nflywheel: {steps} transitions ({episodes} episodes) played in {play_s:.0f}s, BC trained+registered "
          f"in {train_s:.0f}s "
          f"({summary['iterations']} iterations, eval {ev['mean']:.1f} CI {ev['ci95']}), estimates pdis: "
          + ", ".join(f"v{v} {f['mean']:.1f} (agreement {f['agreement']:.1%})" for v, f in figures.items())
          + f"; test {time.monotonic() - t0:.0f}s")
