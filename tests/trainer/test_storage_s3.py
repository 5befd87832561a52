"""output_dir as an S3 URI: a run writes checkpoints and artifacts to an S3-compatible server (moto's, on
127.0.0.1) through pyarrow's filesystem, and a rerun resumes from the checkpoint stored there."""

import pyarrow.fs as pafs
import pytest

from rl_checkpoint import FINAL, Storage, checkpoint_rel, read_state, resolve
from trainer_helpers import run_trainer, summary_of

pytestmark = pytest.mark.slow


def test_train_to_s3_and_resume_from_it(s3):
    uri = s3.uri("cartpole")
    # Hydra's override grammar needs the value quoted when it contains '=' (URI options).
    common = [f"output_dir='{uri}'", "checkpoint.every_n_iterations=1", "stop.episode_return_mean=null",
              "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=1"]
    first = summary_of(run_trainer(*common, "stop.iterations=2", timeout=600))
    run = Storage.open(uri, create=False)
    assert first["checkpoint"] == run.uri(checkpoint_rel(FINAL))

    for name in ("summary.json", "progress.csv", "learning_curve.png"):
        assert run.is_file(name), name
    final = resolve(first["checkpoint"])  # raises unless metadata and RLModule are both there
    assert final.metadata.iteration == 2 and final.module_rel
    assert read_state(run).iteration == 2
    tb = s3.fs.get_file_info(pafs.FileSelector(run.path("tb"), recursive=True))
    assert any("tfevents" in i.path for i in tb)

    second = summary_of(run_trainer(*common, "stop.iterations=1", timeout=600))
    assert second["resumed_from"].startswith(run.uri(checkpoint_rel(FINAL)).split("?")[0])
    assert second["iterations"] == 3
