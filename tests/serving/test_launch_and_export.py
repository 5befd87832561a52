"""The `python -m serving` front door's errors, and the portable TorchScript export's parity."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, subprocess_env

pytestmark = pytest.mark.serve


def test_missing_checkpoint_is_a_clear_error_before_ray_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "serving", "--checkpoint", str(tmp_path / "nope")], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "make train" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_directory_without_a_module_is_a_clear_error_before_ray_starts(tmp_path):
    (tmp_path / "not_a_checkpoint").mkdir()
    proc = subprocess.run([sys.executable, "-m", "serving", "--checkpoint", str(tmp_path / "not_a_checkpoint")],
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "holds no RLModule" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_policy_flag_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "serving", "--policy", "no-equals-sign"], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "NAME=CHECKPOINT" in proc.stderr and "Traceback" not in proc.stderr


def test_serve_config_is_a_valid_serve_deploy_config():
    from ray.serve.schema import ServeDeploySchema

    from serving import launch
    from serving.config import ServerConfig

    cfg = launch.load_config()
    ServeDeploySchema.model_validate(cfg)
    uc = launch.policy_deployment(cfg)["user_config"]
    assert "checkpoint" in uc["policies"]["default"]  # the key the chart overrides
    ServerConfig.parse(uc)


@pytest.mark.parametrize("which", ["cartpole", "trading", "pong"])
def test_torchscript_export_matches_the_rlmodule(which, request, tmp_path):
    ckpt = request.getfixturevalue(f"{which}_checkpoint")
    out = tmp_path / "policy.pt"
    proc = subprocess.run([sys.executable, "-m", "serving.export", "--checkpoint", ckpt, "--out", str(out),
                           "--verify", "0"], cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["out"] == str(out)

    # Parity checked here, independently of the exporter's own check: plain torch vs RLlib's forward_inference.
    import numpy as np
    import torch

    from serving.export import sample_observations
    from serving.policy import LoadedPolicy
    from test_api import reference_actions

    extra = {"policy.json": ""}
    loaded = torch.jit.load(str(out), _extra_files=extra)
    meta = json.loads(extra["policy.json"])
    pol = LoadedPolicy.load("ref", ckpt)
    obs = sample_observations(pol, 64 if which == "pong" else 512, seed=123)
    with torch.inference_mode():
        logits = loaded(torch.from_numpy(obs)).numpy()
    if meta["action_space"]["type"] == "MultiDiscrete":
        parts = np.split(logits, np.cumsum(meta["action_space"]["nvec"])[:-1], axis=-1)
        got = np.stack([p.argmax(-1) for p in parts], -1).tolist()
    else:
        got = logits.argmax(-1).tolist()
    assert got == reference_actions(ckpt, obs)
    assert meta["checkpoint_id"] == pol.checkpoint_id


def test_export_of_a_missing_checkpoint_fails_cleanly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "serving.export", "--checkpoint", str(tmp_path / "nope")], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_checkpoint_without_metadata_falls_back_to_the_modules_spaces(trading_checkpoint, tmp_path, caplog):
    import shutil

    from rl_checkpoint import METADATA_FILE
    from serving.policy import LoadedPolicy

    bare = tmp_path / "bare"
    shutil.copytree(trading_checkpoint, bare)
    (bare / METADATA_FILE).unlink()
    with caplog.at_level("WARNING", logger="serving"):
        pol = LoadedPolicy.load("bare", bare)
    info = pol.info()
    assert info["metadata_source"] == "module" and info["checkpoint_id"].startswith("bare-")
    assert info["action_space"]["type"] == "MultiDiscrete" and info["framestack"] == 1
    assert f"no {METADATA_FILE}" in caplog.text
    assert LoadedPolicy.load("again", bare).checkpoint_id == info["checkpoint_id"]  # stable


def test_export_parity_check_catches_a_tampered_policy(trading_checkpoint, tmp_path):
    """The parity check is what makes `rl-export` fail on a bad file: a file whose policy head was altered
    after export must be reported as disagreeing (and the untouched file must not)."""
    import torch

    from serving.export import _export, check_parity
    from serving.policy import LoadedPolicy

    pol = LoadedPolicy.load("export", trading_checkpoint)
    out = tmp_path / "policy.pt"
    assert _export(pol, out, verify=256)["parity"]["mismatches"] == 0
    tampered = torch.jit.load(str(out))
    head = [p for name, p in tampered.named_parameters() if name.split(".")[-1] == "weight"][-1]  # the logits layer
    with torch.no_grad():
        head.mul_(-1.0)
    torch.jit.save(tampered, str(tmp_path / "tampered.pt"))
    report = check_parity(pol, tmp_path / "tampered.pt", 256)
    assert report["mismatches"] > 0 and report["first_mismatch"] is not None, report


def test_box_action_policy_serves_the_clipped_mean(tmp_path):
    """Box actions: the greedy action is the Gaussian's mean (RLlib's deterministic action), clipped to the bounds."""
    import gymnasium as gym
    import numpy as np
    import torch
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule

    from serving.policy import LoadedPolicy

    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    act_space = gym.spaces.Box(np.array([-0.5, -2.0], np.float32), np.array([0.5, 2.0], np.float32))
    torch.manual_seed(0)
    module = DefaultPPOTorchRLModule(observation_space=obs_space, action_space=act_space, inference_only=False,
                                     model_config={})
    with torch.no_grad():  # a wide mean, so that some actions fall outside the bounds and clipping shows
        for p in module.pi.parameters():
            p.mul_(20.0)
    module.save_to_path(str(tmp_path / "box"))
    pol = LoadedPolicy.load("box", tmp_path / "box")
    assert pol.info()["action_space"] == {"type": "Box", "shape": [2], "dtype": "float32", "low": [-0.5, -2], "high": [0.5, 2]}

    obs = np.random.default_rng(0).uniform(-1, 1, (64, 3)).astype(np.float32)
    got = np.asarray(pol.act(pol.observations(obs.tolist())), np.float32)
    with torch.no_grad():
        logits = module.forward_inference({"obs": torch.from_numpy(obs)})["action_dist_inputs"]
        mean = module.get_inference_action_dist_cls().from_logits(logits).to_deterministic().sample().numpy()
    assert (mean < act_space.low).any() or (mean > act_space.high).any(), "no action needed clipping"
    np.testing.assert_allclose(got, np.clip(mean, act_space.low, act_space.high), rtol=0, atol=1e-6)
