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
    from serving.app import ServerConfig

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

    from serving.policy import LoadedPolicy

    bare = tmp_path / "bare"
    shutil.copytree(trading_checkpoint, bare)
    (bare / "rl_platform.json").unlink()
    with caplog.at_level("WARNING", logger="serving"):
        pol = LoadedPolicy.load("bare", bare)
    info = pol.info()
    assert info["metadata_source"] == "module" and info["checkpoint_id"].startswith("bare-")
    assert info["action_space"]["type"] == "MultiDiscrete" and info["framestack"] == 1
    assert "no rl_platform.json" in caplog.text
    assert LoadedPolicy.load("again", bare).checkpoint_id == info["checkpoint_id"]  # stable
