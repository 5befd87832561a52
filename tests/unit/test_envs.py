"""The env registry shared by trainer and serving: every env builds, and the custom env is a valid gymnasium env."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rl_envs
from rl_envs.trading import TradingEnv


def test_trading_env_passes_gymnasium_checker():
    env = rl_envs.make_env("trading", {"symbols": ["X", "Y", "Z"], "window_size": 8, "episode_length": 20})
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (3 * 8 + 3,) and obs.dtype == np.float32
    assert env.action_space.nvec.tolist() == [3, 3, 3]


def test_trading_env_is_deterministic_per_seed_and_ends():
    a, b = TradingEnv({"episode_length": 5}), TradingEnv({"episode_length": 5})
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    np.testing.assert_array_equal(oa, ob)
    done, steps = False, 0
    while not done:
        _, r, term, trunc, _ = a.step(a.action_space.sample())
        assert np.isfinite(r)
        done, steps = term or trunc, steps + 1
    assert steps == 5


def test_trading_env_rejects_bad_config():
    with pytest.raises(ValueError, match="symbols"):
        TradingEnv({"symbols": []})
    with pytest.raises(ValueError, match="window_size"):
        TradingEnv({"window_size": 0})


def test_pong_env_emits_single_preprocessed_frames():
    env = rl_envs.make_env("pong")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (64, 64, 1) and obs.dtype == np.float32
    assert -1.0 <= obs.min() and obs.max() <= 1.0
    assert rl_envs.get_spec("pong").framestack == 4
    env.close()


def test_preprocess_frame_matches_env_scaling():
    from rl_envs.atari import preprocess_frame

    rgb = np.zeros((210, 160, 3), np.uint8)
    rgb[..., :] = 255
    out = preprocess_frame(rgb)
    assert out.shape == (64, 64, 1) and out.dtype == np.float32
    assert np.allclose(out, 255 / 128.0 - 1.0)
    with pytest.raises(ValueError, match="RGB"):
        preprocess_frame(np.zeros((210, 160), np.uint8))


def test_unknown_env_names_the_known_ones():
    with pytest.raises(KeyError, match="cartpole"):
        rl_envs.make_env("atlantis")


def test_window_mean_covers_at_least_the_last_n_episodes():
    from trainer.callbacks import window_mean

    # 30 episodes at 10, then 2 iterations of long episodes: the last 20 episodes include 18 short ones.
    history = [(30, 10.0), (1, 500.0), (1, 500.0)]
    mean, n = window_mean(history, window=20)
    assert n == 32 and mean == (30 * 10 + 1000) / 32
    assert window_mean([(1, 500.0)], window=20) == (500.0, 1)
    assert window_mean([], window=20)[1] == 0


def test_trading_env_names_an_unknown_option():
    with pytest.raises(ValueError, match=r"unknown env_config keys \['windw_size'\]"):
        TradingEnv({"windw_size": 4})
