"""output_dir as an S3 URI: a run writes checkpoints and artifacts to an S3-compatible server (moto's, on
127.0.0.1) through pyarrow's filesystem, and a rerun resumes from the checkpoint stored there."""

import json
import socket
import subprocess
import sys
import time

import pytest

from trainer_helpers import run_trainer, summary_of

pytestmark = pytest.mark.slow

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3_server(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "moto server did not start"
            time.sleep(0.1)
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="testing",
                           secret_key="testing", region="us-east-1", allow_bucket_creation=True)
    fs.create_dir("rlp")
    try:
        yield port, fs
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_train_to_s3_and_resume_from_it(s3_server):
    port, fs = s3_server
    uri = f"s3://rlp/cartpole?endpoint_override=127.0.0.1:{port}&scheme=http"
    # Hydra's override grammar needs the value quoted when it contains '=' (URI options).
    common = [f"output_dir='{uri}'", "checkpoint.every_n_iterations=1", "stop.episode_return_mean=null",
              "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=1"]
    first = summary_of(run_trainer(*common, "stop.iterations=2", timeout=600))
    assert first["checkpoint"] == f"s3://rlp/cartpole/checkpoints/final?endpoint_override=127.0.0.1:{port}&scheme=http"

    import pyarrow.fs as pafs

    def exists(path):
        return fs.get_file_info(path).type != pafs.FileType.NotFound

    for path in ("rlp/cartpole/summary.json", "rlp/cartpole/progress.csv", "rlp/cartpole/learning_curve.png",
                 "rlp/cartpole/checkpoints/final/rl_platform.json",
                 "rlp/cartpole/checkpoints/final/learner_group/learner/rl_module/default_policy"):
        assert exists(path), path
    with fs.open_input_stream("rlp/cartpole/state.json") as f:
        assert json.loads(f.read())["iteration"] == 2
    tb = fs.get_file_info(pafs.FileSelector("rlp/cartpole/tb", recursive=True))
    assert any("tfevents" in i.path for i in tb)

    second = summary_of(run_trainer(*common, "stop.iterations=1", timeout=600))
    assert second["resumed_from"].startswith("s3://rlp/cartpole/checkpoints/final")
    assert second["iterations"] == 3
