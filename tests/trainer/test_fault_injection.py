"""Faults injected on purpose into a real training run: a crashed env runner is replaced and training goes on."""

import json
import subprocess

import psutil
import pytest

from trainer_helpers import REPO, short_tmp, trainer_cmd, trainer_env

pytestmark = pytest.mark.slow
ITERS = 30


def test_killed_env_runner_is_restarted_and_training_continues(tmp_path):
    # Enough iterations for Ray to start the replacement worker on a loaded machine (seconds; 6 were too few there):
    # RLlib counts the restart once the new runner answers its health probe.
    cmd = trainer_cmd(f"output_dir={tmp_path}", f"stop.iterations={ITERS}", "resources.num_env_runners=1",
                      "algo.train_batch_size=400", "algo.minibatch_size=100", "algo.num_epochs=1",
                      f"resources.ray_tmp_dir={short_tmp()}")
    proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    lines, killed = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "| env steps" in line and not killed:  # training is under way: SIGKILL the env runner's process
                for child in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        if "EnvRunner" in child.name():
                            child.kill()
                            killed.append(child.pid)
                    except psutil.Error:
                        pass
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert killed, f"no env runner process found to kill:\n{out[-3000:]}"
    assert proc.returncode == 0, out[-3000:]
    assert "env runner restarted" in out
    summary = json.loads(lines[-1])
    assert summary["iterations"] == ITERS and summary["env_runner_restarts"] >= 1, summary
    killed_at = next(l for l in lines if "| env steps" in l)
    steps_at_kill = int(killed_at.split("env steps")[1].split("|")[0].replace(",", ""))
    assert summary["env_steps"] > steps_at_kill  # the replacement runner sampled
