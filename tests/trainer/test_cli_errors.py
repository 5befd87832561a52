"""Wrong input to the real entry point: one clear line naming the problem, a non-zero exit, no traceback."""

import json

import pytest

from trainer_helpers import run_trainer, short_tmp


def assert_clean_failure(proc, *needles):
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr + proc.stdout
    assert "Traceback" not in err, err[-3000:]
    for n in needles:
        assert n in err, f"{n!r} not in:\n{err[-3000:]}"


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["experiment=atlantis_ppo"], ["experiment/atlantis_ppo", "cartpole_ppo"]),
        (["algo=sac"], ["algo/sac"]),
        (["env=atlantis"], ["env/atlantis"]),
        (["algo.lrr=0.1"], ["algo.lrr"]),
        (["+algo.lrr=0.1"], ["unknown key algo.lrr"]),
        (["algo.lr=fast"], ["fast", "algo.lr"]),
        (["stop.env_steps=0"], ["stop.env_steps"]),
        (["resources.num_env_runners=-2"], ["resources.num_env_runners"]),
        (["tune.scheduler=median"], ["tune.scheduler"]),
        (["tune=asha", "tune.param_space.nope={uniform:[0,1]}"], ["nope"]),
    ],
)
def test_bad_config_fails_before_ray(overrides, needles, tmp_path):
    proc = run_trainer(*overrides, f"output_dir={tmp_path}", check=False, timeout=120)
    assert_clean_failure(proc, *needles)


def test_unreachable_ray_address(tmp_path):
    proc = run_trainer(
        "resources=cluster", "resources.address=127.0.0.1:9", f"output_dir={tmp_path}", check=False, timeout=120
    )
    assert_clean_failure(proc, "cannot reach Ray at '127.0.0.1:9'")
    assert proc.returncode == 2


def test_resume_must_without_checkpoint(tmp_path):
    proc = run_trainer("fault_tolerance.resume=must", f"output_dir={tmp_path}", check=False, timeout=120)
    assert_clean_failure(proc, "no checkpoint to resume", str(tmp_path))


def test_missing_checkpoint_to_resume(tmp_path):
    # A state file that points at a checkpoint somebody deleted: refuse, naming it, rather than start over silently.
    (tmp_path / "state.json").write_text(json.dumps({"latest_checkpoint": "checkpoints/iter_000004", "iteration": 4}))
    proc = run_trainer(f"output_dir={tmp_path}", f"resources.ray_tmp_dir={short_tmp()}", check=False, timeout=180)
    assert_clean_failure(proc, "checkpoint to resume is missing", "iter_000004")


def test_bad_output_uri(tmp_path):
    proc = run_trainer("output_dir=nosuchscheme://bucket/x", check=False, timeout=120)
    assert_clean_failure(proc, "nosuchscheme://bucket/x")
