"""The object store goes away while the trainer checkpoints to it: one clear line, the last complete checkpoint
stays intact, and once the store is back a rerun resumes from it. The outage is real: the trainer reaches the S3
server through a TCP forwarder that the test closes (connections refused and dropped) and later reopens."""

import socket
import subprocess
import threading

import pytest

from rl_checkpoint import Storage, read_state
from trainer_helpers import REPO, run_trainer, short_tmp, summary_of, trainer_cmd, trainer_env

pytestmark = pytest.mark.slow


class Forwarder:
    """127.0.0.1:port -> 127.0.0.1:target; cut() closes the listener and every open connection."""

    def __init__(self, target: int):
        self.target = target
        self.port = 0
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        self.srv = socket.create_server(("127.0.0.1", self.port))
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._accept, args=(self.srv,), daemon=True).start()

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.srv.close()
        with self.lock:
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns.clear()


def test_s3_outage_during_checkpointing_keeps_the_last_checkpoint_resumable(s3):
    fwd = Forwarder(s3.port)
    uri = f"s3://rlp/outage?endpoint_override=127.0.0.1:{fwd.port}&scheme=http"
    common = [f"output_dir='{uri}'", "checkpoint.every_n_iterations=1", "stop.episode_return_mean=null",
              "algo.train_batch_size=256", "algo.minibatch_size=64", "algo.num_epochs=1"]
    run_trainer(*common, "stop.iterations=1", timeout=600)

    # Second run: resumes, then the store disappears while it trains and checkpoints every iteration.
    cmd = trainer_cmd(*common, "stop.iterations=100000", f"resources.ray_tmp_dir={short_tmp()}")
    proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stdout:
        if "| env steps" in line:
            fwd.cut()
            break
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "cannot write to output_dir" in lines[0] and "is intact" in lines[0], err[-3000:]

    fwd.restore()  # the store is back (same data: moto kept running behind the forwarder)
    state = read_state(Storage.open(s3.uri("outage"), create=False))
    assert state.latest_checkpoint in lines[0]
    third = summary_of(run_trainer(*common, "stop.iterations=1", timeout=600))
    assert third["resumed_from"].split("?")[0].endswith(state.latest_checkpoint)
    assert third["iterations"] == state.iteration + 1
