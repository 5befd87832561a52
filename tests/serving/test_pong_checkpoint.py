"""A real Pong checkpoint from the trainer, loaded by the server's own code in this process (serving.policy's
LoadedPolicy, what a replica runs; no Serve, no HTTP: test_api and test_lifecycle serve Pong over HTTP): train/serve
parity on the same raw ALE frames.

The trained module is run twice on one stretch of Pong: once by the trainer's own env runner (the env and
connectors `trainer.algo.build_algo_config` builds from the run's config.yaml, RLlib's MaxAndSkipEnv / WarpFrame /
FrameStackingEnvToModule), once by the server's code path (sessions fed the raw frames, and the client-stacked
observation). Both must give the module the same input and pick the same greedy action.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, subprocess_env

pytestmark = [pytest.mark.serve, pytest.mark.slow]

STEPS = 48  # agent steps of the recorded stretch (one episode: Pong has no lives and lasts far longer)


@pytest.fixture(scope="module")
def trained_pong(serving_workdir) -> str:
    out = serving_workdir / "train_pong"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "experiment=pong_ppo", f"output_dir={out}", "stop.iterations=1",
         f"resources.ray_tmp_dir={serving_workdir / 'ray_train_pong'}"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["checkpoint"]


def test_trained_pong_checkpoint_loads_with_frame_stacking_in_the_server_code(trained_pong):
    """The replica's loading and session code, in-process: 4-frame stacking of preprocessed raw frames, actions equal
    the checkpoint's own module's."""
    from rl_envs.atari import preprocess_frame
    from serving.policy import LoadedPolicy
    from test_api import reference_actions

    pol = LoadedPolicy.load("pong", trained_pong)
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
    assert got == reference_actions(trained_pong, np.stack(stacks))


def record_training_path(checkpoint: str, steps: int) -> list[dict]:
    """Greedy steps of the trainer's own env runner on the trained weights, with the raw ALE frames behind each.

    Per agent step: `pair`, the last two raw RGB frames of the MaxAndSkipEnv step that produced the observation;
    `env_obs`, that observation; `model_input`, what the env-to-module connectors gave the module; `action`, the
    action the runner sent to the env; `logits`, the module's action_dist_inputs.
    """
    from omegaconf import OmegaConf
    from ray.rllib.core.rl_module.rl_module import RLModule
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.env.wrappers.atari_wrappers import MaxAndSkipEnv, get_wrapper_by_cls

    from rl_checkpoint import resolve
    from trainer.algo import build_algo_config

    run_cfg = OmegaConf.load(Path(checkpoint).parents[1] / "config.yaml")  # the run's resolved config
    config = build_algo_config(run_cfg).env_runners(num_envs_per_env_runner=1)
    runner = SingleAgentEnvRunner(config=config)
    module_dir, _ = resolve(checkpoint).local_module_dir()
    runner.module.set_state(RLModule.from_checkpoint(str(module_dir)).get_state(inference_only=True))

    env = runner.env.unwrapped.envs[0]
    skip, ale = get_wrapper_by_cls(env, MaxAndSkipEnv), env.unwrapped
    raw: list[np.ndarray] = []
    skip_steps: list[dict] = []  # one per MaxAndSkipEnv step (no-op/fire resets included)
    inputs: list[tuple[np.ndarray, np.ndarray, int]] = []
    ale_step, skip_step, forward = ale.step, skip.step, runner.module.forward_inference

    def record_ale(action):
        out = ale_step(action)
        raw.append(np.array(out[0], copy=True))
        return out

    def record_skip(action):
        out = skip_step(action)
        skip_steps.append({"pair": np.stack(raw[-2:]), "env_obs": np.array(out[0], copy=True), "action": int(action)})
        return out

    def record_forward(batch, **kw):
        out = forward(batch, **kw)
        inputs.append((batch["obs"].numpy().copy(), out["action_dist_inputs"].detach().numpy().copy(), len(skip_steps)))
        return out

    ale.step, skip.step, runner.module.forward_inference = record_ale, record_skip, record_forward
    episodes = runner.sample(num_timesteps=steps, explore=False, random_actions=False)
    runner.stop()
    assert len(episodes) == 1 and not episodes[0].is_done, "the recorded stretch must be one unfinished episode"
    out = []
    for obs, logits, n in inputs[:steps]:
        seen, acted = skip_steps[n - 1], skip_steps[n]  # the step behind the observation, the one it chose
        out.append({**seen, "model_input": obs[0], "logits": logits[0], "action": acted["action"]})
    return out


def test_pong_train_serve_parity_on_the_same_raw_frames(trained_pong):
    """Same raw ALE frames -> the same module inputs and greedy actions in the trainer's env runner and the server."""
    from rl_envs.atari import preprocess_frame
    from serving.policy import LoadedPolicy

    steps = record_training_path(trained_pong, STEPS)
    assert len(steps) == STEPS
    pol = LoadedPolicy.load("pong", trained_pong)
    zero = np.zeros(pol.frame_shape, np.float32)
    client_frames: list[np.ndarray] = []
    served, client_stacked = [], []
    for t, s in enumerate(steps):
        # The env's own observation is the server's preprocessing of the two raw frames (trainer's order).
        np.testing.assert_array_equal(preprocess_frame(s["pair"]), s["env_obs"], err_msg=f"step {t}")
        # Sessions: the client sends the last two raw frames of each step (here through the validator as JSON).
        obs, new, count = pol.sessions.push("game", pol.frame(s["pair"].tolist()), reset=t == 0)
        assert (new, count) == (t == 0, t + 1)
        np.testing.assert_array_equal(obs, s["model_input"], err_msg=f"session input, step {t}")
        served.append(pol.act(obs[None])[0])
        # A one-iteration policy mostly picks one action: the logits are the finer check.
        np.testing.assert_allclose(pol.inference.logits(obs[None])[0], s["logits"], rtol=0, atol=1e-5)
        # Stateless: the client preprocesses and stacks itself (zero-filled at the episode start).
        client_frames.append(preprocess_frame(s["pair"]))
        window = [zero] * max(0, 4 - len(client_frames)) + client_frames[-4:]
        stacked = pol.observation(np.concatenate(window, axis=-1).tolist())
        np.testing.assert_array_equal(stacked, s["model_input"], err_msg=f"client-stacked input, step {t}")
        client_stacked.append(pol.act(stacked[None])[0])
    trained = [s["action"] for s in steps]
    assert served == trained and client_stacked == trained
    # What the README used to say (max of the raw frames, then preprocess) is not what the trainer sees.
    assert any(not np.array_equal(preprocess_frame(s["pair"].max(axis=0)), s["env_obs"]) for s in steps)
