"""A checkpoint damaged on disk (truncated file, file missing) makes the resume fail with one line naming it."""

import shutil

import pytest

from rl_checkpoint import FINAL, checkpoint_rel
from rl_checkpoint.checkpoint import MODULE_DIR
from trainer_helpers import run_trainer

pytestmark = pytest.mark.slow

TINY = ["algo.train_batch_size=200", "algo.minibatch_size=100", "algo.num_epochs=1", "stop.iterations=1"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    run_trainer(f"output_dir={out}", *TINY)
    return out


def truncate(ckpt):
    f = (ckpt / MODULE_DIR).parents[1] / "state.pkl"  # the learner's state beside its rl_module/
    f.write_bytes(f.read_bytes()[:100])


def remove(ckpt):
    (ckpt / "algorithm_state.pkl").unlink()


@pytest.mark.parametrize("damage, needle", [(truncate, "truncated"), (remove, "algorithm_state.pkl")])
def test_damaged_checkpoint_fails_the_resume_with_one_line(trained_run, tmp_path, damage, needle):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    damage(run / checkpoint_rel(FINAL))
    proc = run_trainer(f"output_dir={run}", *TINY, check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    err = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1, proc.stderr[-3000:]
    assert "checkpoint to resume is unreadable" in err[0] and str(run / checkpoint_rel(FINAL)) in err[0]
    assert needle in err[0], err[0]
