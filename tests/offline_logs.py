"""Transition logs for the offline tests, in the policy server's log schema (version 1, serving/transitions.py):
a checkpoint's greedy policy (the action the server returns) plays seeded CartPole episodes in this process and
every step becomes one Parquet row in RLlib's offline column format, plus the server's provenance columns."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([
    ("eps_id", pa.string()), ("agent_id", pa.null()), ("module_id", pa.null()),
    ("obs", pa.list_(pa.float32())), ("new_obs", pa.list_(pa.float32())), ("actions", pa.int64()),
    ("rewards", pa.float64()), ("terminateds", pa.bool_()), ("truncateds", pa.bool_()), ("t", pa.int64()),
    ("action_logp", pa.float32()), ("policy", pa.string()), ("version", pa.string()),
    ("checkpoint_id", pa.string()), ("session_id", pa.string()), ("time", pa.float64()),
])


def write_log(checkpoint: str, folder: Path, transitions: int, seed: int = 0, policy: str = "cartpole",
              rows_per_file: int = 5000, max_episode_steps: int = 500) -> Path:
    """At least `transitions` rows (whole episodes) of `checkpoint` acting greedily, under folder/<policy>/."""
    import gymnasium as gym

    from rl_eval.episodes import load_policy

    pol = load_policy(checkpoint)
    env = gym.make("CartPole-v1", max_episode_steps=max_episode_steps)
    out = folder / policy
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    files, n = 0, 0

    def flush() -> None:
        nonlocal rows, files
        if rows:
            pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), out / f"part-{files:05d}.parquet")
            files += 1
            rows = []

    while n < transitions:
        obs, _ = env.reset(seed=seed)
        sid = uuid.uuid4().hex
        seed += 1
        t, done = 0, False
        while not done:
            action = int(pol.act(pol.observation(obs)[None])[0])
            new_obs, reward, term, trunc, _ = env.step(action)
            done = term or trunc
            rows.append({"eps_id": sid, "agent_id": None, "module_id": None, "obs": obs.tolist(),
                         "new_obs": new_obs.tolist(), "actions": action, "rewards": float(reward),
                         "terminateds": bool(term), "truncateds": bool(trunc), "t": t, "action_logp": 0.0,
                         "policy": policy, "version": "champion", "checkpoint_id": pol.checkpoint_id,
                         "session_id": sid, "time": time.time()})
            obs, t, n = new_obs, t + 1, n + 1
            if len(rows) >= rows_per_file and done:
                flush()
    flush()
    env.close()
    return out



def row(eps_id: str, t: int, obs, action, reward: float = 1.0, done: bool = False, logp: float = 0.0) -> dict:
    """One transition in the log schema (provenance columns filled with fixed values)."""
    return {"eps_id": eps_id, "agent_id": None, "module_id": None, "obs": list(obs), "new_obs": list(obs),
            "actions": action, "rewards": reward, "terminateds": done, "truncateds": False, "t": t,
            "action_logp": logp, "policy": "cartpole", "version": "champion", "checkpoint_id": "synthetic",
            "session_id": eps_id, "time": 0.0}


def write_rows(path: Path, rows: list[dict], schema: pa.Schema = SCHEMA) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path
