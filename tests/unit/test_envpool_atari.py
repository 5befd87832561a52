"""The EnvPool backend (rl_envs.envpool_atari) against the gymnasium one on fixed seeds and actions.

Alignment: EnvPool is built with one no-op frame and no FIRE at reset (`noop_max=1, use_fire_reset=False`), and an
ale-py env (frameskip 1, no sticky actions) is reset and stepped once with NOOP; from there both play the same seeded
random actions, the ale-py one 4 raw frames per action. Then:

- the emulators agree exactly: EnvPool's max of the last two raw RGB frames of each skip is ale-py's, and so are the
  rewards (the ALE inside EnvPool renders the same frames);
- the backend's observation is exactly EnvPool's documented pipeline on those raw frames (greyscale, max of the
  last two frames of the skip, area resize, scaled to [-1, 1]): a build without the max-pool, or with another
  resize or scale, fails here;
- against the gymnasium backend's preprocessing of the same raw frames (rl_envs.atari.preprocess_frame, which
  tests/serving/test_pong_checkpoint.py proves equals the trainer's gymnasium env and what the server computes),
  the only difference is the order of max and resize: cells whose source pixels did not change between the two
  frames are identical; the others (moving ball and paddles) are never darker, and few.
"""

from __future__ import annotations

import numpy as np
import pytest

envpool = pytest.importorskip("envpool")  # declared in pyproject.toml: installed by `make test`'s venv

import gymnasium as gym  # noqa: E402

from rl_envs import make_env  # noqa: E402
from rl_envs.atari import preprocess_frame  # noqa: E402
from rl_envs.envpool_atari import EnvPoolAtari  # noqa: E402

STEPS = 300
ALIGNED = {"noop_max": 1, "use_fire_reset": False}  # EnvPool's reset = reset_game + 1 NOOP frame


def ale_raw():
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, full_action_space=False)
    env.reset(seed=0)
    env.step(0)
    return env


def play_raw(env, actions):
    """Per action: (last two raw RGB frames of a 4-frame skip, summed reward)."""
    out = []
    for a in actions:
        frames, reward = [], 0.0
        for _ in range(4):
            f, r, term, trunc, _ = env.step(int(a))
            frames.append(f)
            reward += r
            assert not (term or trunc)
        out.append((np.stack(frames[-2:]), reward))
    return out


@pytest.fixture(scope="module")
def actions():
    return np.random.default_rng(0).integers(0, 6, STEPS)


@pytest.fixture(scope="module")
def raw(actions):
    env = ale_raw()
    out = play_raw(env, actions)
    env.close()
    return out


def test_the_emulator_inside_envpool_renders_ale_py_frames(actions, raw):
    pool = envpool.make("Pong-v5", env_type="gymnasium", num_envs=1, seed=0, stack_num=1, gray_scale=False,
                        img_height=210, img_width=160, frame_skip=4, **ALIGNED)
    pool.reset()
    rewards = 0
    for t, (a, (pair, reward)) in enumerate(zip(actions, raw)):
        obs, r, *_ = pool.step(np.array([a]))
        np.testing.assert_array_equal(obs[0].transpose(1, 2, 0), pair.max(axis=0), err_msg=f"step {t}")
        assert r[0] == reward, t
        rewards += abs(reward)
    pool.close()
    assert rewards > 0, "the stretch scores no point: rewards were not compared"


def test_backend_observations_match_the_gymnasium_path(actions, raw):
    import cv2

    env = EnvPoolAtari({}, num_envs=1, seed=0, **ALIGNED)
    gym_env = make_env("pong")
    assert env.single_observation_space == gym_env.observation_space
    assert env.single_action_space == gym_env.action_space
    obs, _ = env.reset()
    assert obs.shape == (1, 64, 64, 1) and obs.dtype == np.float32

    moved_steps, diff_cells, cells = 0, 0, 0
    for t, (a, (pair, reward)) in enumerate(zip(actions, raw)):
        obs, r, term, trunc, _ = env.step(np.array([a]))
        got = obs[0]
        assert r[0] == reward and not term[0] and not trunc[0]
        grey = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in pair]
        # EnvPool's order: max of the two greyscale raw frames, then area resize.
        envpool_order = cv2.resize(np.maximum(*grey), (64, 64), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(got, envpool_order[:, :, None].astype(np.float32) / 128.0 - 1.0,
                                      err_msg=f"step {t}: not max-pool -> resize -> scale")
        # The gymnasium backend's order (and the server's): resize each frame, then max.
        gym_order = preprocess_frame(pair)
        moved = cv2.resize((grey[0] != grey[1]).astype(np.float32), (64, 64), interpolation=cv2.INTER_AREA) > 0
        still = ~moved[:, :, None]
        np.testing.assert_array_equal(got[still], gym_order[still], err_msg=f"step {t}: a still cell differs")
        assert (got >= gym_order - 1.5 / 128).all(), f"step {t}: max before resize is never darker"
        moved_steps += bool(moved.any())
        diff_cells += int((got != gym_order).sum())
        cells += got.size
    env.close()
    assert moved_steps > STEPS // 2, "too few steps where the frames of a skip differ: the max-pool went untested"
    # Measured: ~0.5% of the cells differ (by a few grey levels), all on moving objects.
    assert 0 < diff_cells / cells < 0.02, diff_cells / cells


def test_backend_is_seeded_and_resets_episodes():
    a, b = EnvPoolAtari({}, num_envs=2, seed=5), EnvPoolAtari({}, num_envs=2, seed=5)
    oa, _ = a.reset()
    ob, _ = b.reset()
    np.testing.assert_array_equal(oa, ob)
    acts = np.random.default_rng(1).integers(0, 6, (40, 2))
    for act in acts:
        ra, rb = a.step(act), b.step(act)
        np.testing.assert_array_equal(ra[0], rb[0])
    # A seeded reset replaces the pool: the same start as a fresh pool with that seed.
    oc, _ = a.reset(seed=9)
    od, _ = EnvPoolAtari({}, num_envs=2, seed=9).reset()
    np.testing.assert_array_equal(oc, od)
    a.close()
    b.close()
