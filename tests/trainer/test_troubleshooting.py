"""README "Troubleshooting": every local command it documents runs against a real Ray and shows what it promises.

The Ray is started with the README's own `ray start` line (plus ephemeral ports on 127.0.0.1 and a private temp dir),
the README's trainer line runs one iteration against it, then each remaining line of the section's ```bash blocks
runs through bash as a user would paste it. kubectl lines (```sh blocks) are for the cluster tier.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from trainer_helpers import REPO, free_ports, short_tmp

pytestmark = pytest.mark.slow

# What each documented command must show on a Ray that just ran a job with one env runner and one learner actor.
EXPECT = {
    "ray status": "Resources",
    "ray memory": "Plasma memory",
    "ray list actors": "SingleAgentEnvRunner",
    "ray list nodes": "resources_total",
    "python -m trainer.diagnose": "learner",
    "grep ": "",
    "ls ": "",
}


def section_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Troubleshooting\n", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        lines += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    return lines



@pytest.fixture(scope="module")
def ray_head():
    cmds = section_commands()
    (start,) = [c for c in cmds if c.startswith("ray start")]
    tmp, (port, dash_port, client_port) = short_tmp("rts"), free_ports(3)
    env = dict(os.environ, RAY_TMP=tmp, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        ["bash", "-c", f"exec {start} --block --port {port} --node-ip-address 127.0.0.1 "
                       f"--dashboard-port {dash_port} --ray-client-server-port {client_port} --disable-usage-stats"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while subprocess.run(["ray", "status"], env=env, capture_output=True).returncode != 0:
            assert head.poll() is None, head.stdout.read()[-3000:]
            assert time.time() < deadline, "ray start --head not ready in 120 s"
            time.sleep(1)
        yield env, cmds
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@pytest.fixture(scope="module")
def ran_a_job(ray_head, tmp_path_factory):
    env, cmds = ray_head
    (train,) = [c for c in cmds if c.startswith("python -m trainer ")]
    out = tmp_path_factory.mktemp("ts")
    for attempt in range(2):
        proc = subprocess.run(["bash", "-c", f"{train} stop.iterations=1 output_dir={out}"], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        if attempt or not (proc.returncode == 2 and "cannot connect to Ray" in proc.stderr):
            break
        # Seen once in CI with both suite groups loading 2 cores: the head had just answered `ray status`, and the
        # driver's connection still gave up inside Ray's own fixed timeouts. The machine, not the command: once more,
        # said in the test's output (the error now carries Ray's reason).
        print(f"trainer: {proc.stderr.strip()}; retrying once")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return env, [c for c in cmds if not c.startswith(("ray start", "python -m trainer "))]


def test_every_documented_local_command_runs(ran_a_job):
    env, cmds = ran_a_job
    assert len(cmds) >= 6, cmds
    for cmd in cmds:
        needle = next((v for k, v in EXPECT.items() if cmd.startswith(k)), None)
        assert needle is not None, f"no expectation for documented command {cmd!r}"
        proc = subprocess.run(["bash", "-c", cmd], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        assert needle in proc.stdout, f"{cmd}: {needle!r} not in\n{proc.stdout[-2000:]}"


def test_diagnose_places_the_jobs_actors(ran_a_job):
    env, _ = ran_a_job
    proc = subprocess.run([sys.executable, "-m", "trainer.diagnose", "--all"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    roles = [line.split()[0] for line in proc.stdout.splitlines()]
    assert roles.count("learner") == 1 and roles.count("env_runner") == 1, proc.stdout
    assert all(line.endswith(" ok") for line in proc.stdout.splitlines())
