"""A request the embedded Ray can never place fails at once naming the resource (it used to wait for ever)."""

import subprocess
import threading
import time

import pytest

from trainer_helpers import REPO, short_tmp, trainer_cmd, trainer_env

# From the trainer's "ray ready" line to its one error line (the capacity check, then Ray's shutdown), measured
# 1.3-1.5 s on this machine (2 cores shared with other test runs; the whole run took 16 s quiet, 40 s loaded, most
# of it Ray's start). A correctness bound, generous for a loaded machine: an embedded Ray that waited for nodes
# instead (resources.wait_for_resources_s, 300 s by default) exceeds it by minutes.
BOUND_S = 30
START_S = 300  # Ray's own start on a loaded machine, not what this test bounds


@pytest.mark.slow  # starts an embedded Ray (seconds each)
@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["resources.num_learners=1", "resources.num_gpus_per_learner=1"], "GPU 1"),
        (["resources.num_env_runners=1", "resources.rollout_resource=rollout_pool"], "rollout_pool"),
    ],
)
def test_unsatisfiable_request_fails_at_once_on_embedded_ray(overrides, needle, tmp_path):
    cmd = trainer_cmd(*overrides, "resources.num_cpus=2", f"output_dir={tmp_path}",
                      f"resources.ray_tmp_dir={short_tmp()}")
    proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[tuple[float, str]] = []  # (when it was read, line): stdout and stderr in the order written
    killer = threading.Timer(START_S, proc.kill)
    killer.start()
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
            if "ray ready in" in line:  # from here on the request must be refused within the bound
                killer.cancel()
                killer = threading.Timer(BOUND_S, proc.kill)
                killer.start()
        code = proc.wait(timeout=60)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
    out = "\n".join(l for _, l in lines)
    ready = next((t for t, l in lines if "ray ready in" in l), None)
    assert ready is not None, f"Ray did not start within {START_S}s (exit {code}):\n{out[-3000:]}"
    err = [(t, l) for t, l in lines if l.startswith("error:")]
    assert err, f"no error within {BOUND_S}s of Ray being ready: an unsatisfiable request on an embedded Ray must " \
                f"fail at once, not wait for resources (exit {code}):\n{out[-3000:]}"
    took = err[0][0] - ready
    assert took <= BOUND_S, f"refused {took:.1f}s after Ray was ready (bound {BOUND_S}s):\n{out[-3000:]}"
    assert code == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len(err) == 1 and needle in err[0][1] and "embedded Ray cannot add nodes" in err[0][1], out[-2000:]
    assert "waiting up to" not in out, "an embedded Ray waited for nodes it cannot get"
    print(f"refused {took:.1f}s after Ray was ready")
