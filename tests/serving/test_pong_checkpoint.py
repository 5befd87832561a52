"""A real Pong checkpoint from the trainer: the served module sees 4 stacked 64x64 frames, as the server assumes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, subprocess_env

pytestmark = [pytest.mark.serve, pytest.mark.slow]


def test_trained_pong_checkpoint_is_served_with_frame_stacking(serving_workdir):
    out = serving_workdir / "train_pong"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "experiment=pong_ppo", f"output_dir={out}", "stop.iterations=1",
         f"resources.ray_tmp_dir={serving_workdir / 'ray_train_pong'}"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = json.loads(proc.stdout.strip().splitlines()[-1])["checkpoint"]

    from rl_envs.atari import preprocess_frame
    from serving.policy import LoadedPolicy
    from test_api import reference_actions

    pol = LoadedPolicy.load("pong", ckpt)
    assert pol.framestack == 4 and tuple(pol.observation_space.shape) == (64, 64, 4)
    assert pol.frame_shape == (64, 64, 1) and pol.info()["frame"]["raw_rgb_accepted"]
    raw = np.random.default_rng(0).integers(0, 256, size=(5, 210, 160, 3), dtype=np.uint8)
    frames = [preprocess_frame(f) for f in raw]
    got, stacks = [], []
    for t, f in enumerate(raw):
        obs, new, _ = pol.sessions.push("s", pol.frame(f.tolist()), reset=t == 0)
        window = [np.zeros_like(frames[0])] * max(0, 3 - t) + frames[max(0, t - 3): t + 1]
        stacks.append(np.concatenate(window, axis=-1))
        np.testing.assert_array_equal(obs, stacks[-1])
        got.append(pol.act(obs[None])[0])
    assert got == reference_actions(ckpt, np.stack(stacks))
