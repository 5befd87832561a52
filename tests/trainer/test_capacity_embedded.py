"""A request the embedded Ray can never place fails in seconds naming the resource (it used to wait for ever)."""

import pytest

from trainer_helpers import run_trainer


@pytest.mark.slow  # starts an embedded Ray (seconds each)
@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["resources.num_learners=1", "resources.num_gpus_per_learner=1"], "GPU 1"),
        (["resources.num_env_runners=1", "resources.rollout_resource=rollout_pool"], "rollout_pool"),
    ],
)
def test_unsatisfiable_request_fails_fast_on_embedded_ray(overrides, needle, tmp_path):
    proc = run_trainer(*overrides, "resources.num_cpus=2", f"output_dir={tmp_path}", check=False, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    err = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and needle in err[0] and "embedded Ray cannot add nodes" in err[0], proc.stderr[-2000:]
