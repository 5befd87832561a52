"""A Pong policy trained on the EnvPool backend (`env.backend=envpool`) is served by serving/ unchanged.

The real trainer runs 2 iterations of `experiment=pong_ppo env.backend=envpool` (EnvPool inside the env runner,
tests/unit/test_envpool_atari.py checks its observations against the gymnasium backend), then the real server
(`python -m serving`, Ray Serve over HTTP on 127.0.0.1) serves the final checkpoint and plays a stretch of real
Pong: the client sends the last two raw ALE frames of each 4-frame skip in a session, steps the emulator with the
served action, and every served action equals the checkpoint's own RLModule's on the same stacked frames.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest
import requests
from omegaconf import OmegaConf

from conftest import REPO, ServerProcess, subprocess_env

pytestmark = [pytest.mark.serve, pytest.mark.slow]

STEPS = 16


@pytest.fixture(scope="module")
def envpool_pong(serving_workdir) -> str:
    out = serving_workdir / "train_pong_envpool"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "experiment=pong_ppo", "env.backend=envpool", f"output_dir={out}",
         "stop.iterations=2", f"resources.ray_tmp_dir={serving_workdir / 'ray_train_envpool'}"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 2 and summary["env_steps"] >= 2 * 4000, summary
    assert OmegaConf.load(out / "config.yaml").env.backend == "envpool"
    return summary["checkpoint"]


def test_envpool_trained_pong_served_over_http(envpool_pong, serving_workdir):
    import ale_py
    import gymnasium as gym

    from rl_envs.atari import preprocess_frame
    from test_api import reference_actions

    workdir = serving_workdir / "server_envpool"
    workdir.mkdir()
    srv = ServerProcess(workdir, {"pong": envpool_pong})
    try:
        info = requests.get(srv.base + "/v1/policies/pong", timeout=30).json()
        assert info["framestack"] == 4 and info["observation_space"]["shape"] == [64, 64, 4], info
        gym.register_envs(ale_py)
        env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, full_action_space=False)
        env.reset(seed=3)
        frames, got = [], []
        action = 0
        for t in range(STEPS):
            raw = []
            for _ in range(4):
                raw.append(env.step(action)[0])
            pair = np.stack(raw[-2:])
            frames.append(preprocess_frame(pair))
            enc = {"b64": base64.b64encode(pair.tobytes()).decode(), "dtype": "uint8", "shape": [2, 210, 160, 3]}
            r = requests.post(srv.base + "/v1/policies/pong/act",
                              json={"session_id": "ep", "frame": enc, **({"reset": True} if t == 0 else {})},
                              timeout=30)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["checkpoint_id"] == info["checkpoint_id"] and body["session"]["frames"] == t + 1
            action = body["action"]
            got.append(action)
        env.close()
        zero = np.zeros_like(frames[0])
        stacks = np.stack([np.concatenate(([zero] * 3 + frames)[t:t + 4], axis=-1) for t in range(STEPS)])
        assert got == reference_actions(envpool_pong, stacks)
    finally:
        rc = srv.stop()
    assert rc == 0, f"server exited {rc} on SIGINT:\n{srv.log_tail()}"
