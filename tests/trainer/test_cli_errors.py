"""Wrong input to the real entry point: one clear line naming the problem, a non-zero exit, no traceback."""

from pathlib import Path

import pytest

from rl_checkpoint import RunState, Storage, checkpoint_rel, iter_name, write_state
from trainer_helpers import run_trainer, short_tmp


def assert_clean_failure(proc, *needles):
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr + proc.stdout
    assert "Traceback" not in err, err[-3000:]
    for n in needles:
        assert n in err, f"{n!r} not in:\n{err[-3000:]}"


# README: Hydra's own compose errors (unknown group option, misspelt key, wrong type) exit 1; value errors exit 2.
HYDRA, VALUE = 1, 2


@pytest.mark.parametrize(
    "overrides, needles, rc",
    [
        (["experiment=atlantis_ppo"], ["experiment/atlantis_ppo", "cartpole_ppo"], HYDRA),
        (["algo=sac"], ["algo/sac"], HYDRA),
        (["env=atlantis"], ["env/atlantis"], HYDRA),
        (["algo.lrr=0.1"], ["algo.lrr"], HYDRA),
        (["+algo.lrr=0.1"], ["unknown key algo.lrr"], VALUE),
        (["algo.lr=fast"], ["fast", "algo.lr"], HYDRA),
        (["stop.env_steps=0"], ["stop.env_steps"], VALUE),
        (["resources.num_env_runners=-2"], ["resources.num_env_runners"], VALUE),
        (["tune.scheduler=median"], ["tune.scheduler"], VALUE),
        (["resources.auth=none"], ["resources.auth"], VALUE),
        (["tune=asha", "tune.param_space.nope={uniform:[0,1]}"], ["tune.param_space.nope"], HYDRA),
        (["tune=asha", "+tune.param_space.nope={uniform:[0,1]}"], ["param_space", "does not have", "nope"], VALUE),
        (["tune=asha", "+tune.param_space.gamma={sometimes:[1]}"], ["tune.param_space.gamma", "loguniform"], VALUE),
        # fp16 needs CUDA loss scaling: refused on CPU learners before Ray starts, pointing at bf16.
        (["algo.precision=fp16"], ["algo.precision=fp16 needs GPU learners", "bf16"], VALUE),
        (["algo.precision=fp8"], ["algo.precision", "fp8"], VALUE),
        (["debug.timeline=s3://b/t.json"], ["debug.timeline must be a local file path"], VALUE),
        (["evaluation.episodes=0"], ["evaluation.episodes must be >= 1"], VALUE),
        (["evaluation=off", "stop.eval_return_mean=400"], ["stop.eval_return_mean needs evaluation on"], VALUE),
        # A registry the run could never register into fails before training, not after it.
        (["registry.root=/nonexistent-rlp/x/registry"], ["registry.root /nonexistent-rlp/x/registry does not exist"], VALUE),
        (["registry.root=gs://bucket/registry"], ["scheme 'gs' is not supported"], VALUE),
        # The env's own rules, the numeric bounds: one line before Ray, not an env runner's traceback after it.
        (["~experiment", "algo=ppo", "env=trading", "env.env_config.symbols=[]"],
         ["error: env.env_config: trading env: `symbols` must name at least one symbol"], VALUE),
        (["algo.gamma=1.5"], ["error: algo.gamma must be in [0, 1], got 1.5"], VALUE),
        # env.backend: a name no env has, and EnvPool (Atari only) for CartPole.
        (["env.backend=bogus"], ["error: unknown env.backend 'bogus'; env 'cartpole' has: gymnasium"], VALUE),
        (["env.backend=envpool"], ["error: env.backend=envpool is for Atari envs (pong); env 'cartpole' has: gymnasium"],
         VALUE),
        (["experiment=pong_ppo", "env.backend=envpool", "env.env_config.game=ALE/NotAGame-v5"],
         ["error: env.env_config: atari env: unknown game 'ALE/NotAGame-v5'"], VALUE),
        # APPO: RLlib itself raised a TypeError (minibatch % "auto") from inside the algorithm's build.
        (["~experiment", "algo=appo", "env=cartpole", "algo.minibatch_size=25"],
         ["error: algo.minibatch_size=25 with appo needs an integer env.rollout_fragment_length"], VALUE),
        (["~experiment", "algo=appo", "env=cartpole", "algo.minibatch_size=30", "env.rollout_fragment_length=25"],
         ["error: algo.minibatch_size (30) must be a multiple of env.rollout_fragment_length (25)"], VALUE),
    ],
)
def test_bad_config_fails_before_ray(overrides, needles, rc, tmp_path):
    ray_tmp = short_tmp()
    proc = run_trainer(*overrides, f"output_dir={tmp_path}", f"resources.ray_tmp_dir={ray_tmp}", check=False,
                       timeout=120)
    assert_clean_failure(proc, *needles)
    assert proc.returncode == rc, f"exit {proc.returncode}, README says {rc}:\n{proc.stderr[-2000:]}"
    # Before Ray: the trainer never logged "ray ready" and Ray never created its session under the temp dir.
    assert "ray ready" not in proc.stdout, proc.stdout[-2000:]
    assert not list(Path(ray_tmp).glob("session_*")), list(Path(ray_tmp).iterdir())


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
    write_state(Storage.open(str(tmp_path)), RunState(latest_checkpoint=checkpoint_rel(iter_name(4)), iteration=4))
    proc = run_trainer(f"output_dir={tmp_path}", f"resources.ray_tmp_dir={short_tmp()}", check=False, timeout=180)
    assert_clean_failure(proc, "checkpoint to resume is missing", iter_name(4))


def test_bad_output_uri(tmp_path):
    proc = run_trainer("output_dir=nosuchscheme://bucket/x", check=False, timeout=120)
    assert_clean_failure(proc, "nosuchscheme://bucket/x")


def test_unwritable_output_dir_fails_before_ray():
    ray_tmp = short_tmp()
    proc = run_trainer("output_dir=/proc/rlp-forbidden/run", f"resources.ray_tmp_dir={ray_tmp}", check=False,
                       timeout=120)
    assert_clean_failure(proc, "error: output_dir /proc/rlp-forbidden/run is not writable")
    assert proc.returncode == VALUE
    assert not list(Path(ray_tmp).glob("session_*")), list(Path(ray_tmp).iterdir())
