"""Helpers and fixtures for the container-image tests (marker `docker`); tests/containers/conftest.py exposes the fixtures.

They use a real Docker engine: `hack/images.sh dockerd` starts one when none answers, and the images are built
(or found up to date in the build cache) by `hack/images.sh build`. Without a usable engine the tests skip,
except in CI (CI=true), where they fail.

Environment:
  RLP_SKIP_IMAGE_BUILD=1  test the images as they are (do not run hack/images.sh build first)
  RLP_TEST_GPU_IMAGE=0    do not build and check the GPU image (it costs ~1.5 min after the CPU image, ~6 GB)
  RLP_TEST_DIRECT_BUILD=1 also build the CPU image with pip inside the build reaching the index (slow, ~3 GB)
  RLP_CONTAINER_MEMORY    --memory for the smoke containers (default 3g)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from trainer_helpers import wait_for  # noqa: F401 - re-exported for the container tests

ROOT = Path(__file__).resolve().parents[2]
IMAGES_SH = ROOT / "hack" / "images.sh"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MEMORY = os.environ.get("RLP_CONTAINER_MEMORY", "3g")
# What every smoke container runs under: the limits of the issue, non-root (the image's USER 1000:100), a
# read-only root filesystem with a tmpfs /tmp (Ray's /tmp/ray, HOME), room in /dev/shm for Ray's object store,
# no capabilities, no privilege escalation: what a restricted Kubernetes pod gets.
HARDENED = [
    "--cpus", "2",
    "--memory", MEMORY,
    "--shm-size", "1g",
    "--read-only",
    "--tmpfs", "/tmp:rw,exec,nosuid,size=2g",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
]


def docker_missing(msg: str):
    """Skip, or in CI fail: CI must prove the images, not quietly skip them."""
    if IN_CI:
        pytest.fail(f"CI=true and {msg}", pytrace=False)
    pytest.skip(msg)


def run(cmd: list[str], timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} -> exit {p.returncode}\n--- stdout ---\n{p.stdout[-4000:]}\n--- stderr ---\n{p.stderr[-4000:]}"
        )
    return p


def docker(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    return run(["docker", *args], timeout=timeout, check=check)


def image_tag(flavour: str) -> str:
    return run([str(IMAGES_SH), "tag", flavour], cwd=ROOT).stdout.strip()


@pytest.fixture(scope="session")
def docker_engine() -> str:
    if shutil.which("docker") is None and not IN_CI and os.geteuid() != 0:
        pytest.skip("no docker client (apt-get install docker.io)")
    p = run([str(IMAGES_SH), "dockerd"], cwd=ROOT, timeout=300, check=False)
    if p.returncode != 0:
        docker_missing(f"no Docker engine could be started:\n{p.stderr[-2000:]}")
    return docker("version", "--format", "{{.Server.Version}}").stdout.strip()


def build(flavour: str) -> str:
    tag = image_tag(flavour)
    if os.environ.get("RLP_SKIP_IMAGE_BUILD") == "1":
        if docker("image", "inspect", tag, check=False).returncode != 0:
            pytest.fail(f"RLP_SKIP_IMAGE_BUILD=1 but {tag} is not built", pytrace=False)
        return tag
    t = time.monotonic()
    p = run([str(IMAGES_SH), "build", flavour], cwd=ROOT, timeout=3000, check=False)
    if p.returncode != 0:
        pytest.fail(f"hack/images.sh build {flavour} failed:\n{p.stderr[-6000:]}", pytrace=False)
    print(f"\n[containers] hack/images.sh build {flavour}: {time.monotonic() - t:.0f} s")
    return tag


@pytest.fixture(scope="session")
def cpu_image(docker_engine) -> str:
    return build("cpu")


@pytest.fixture(scope="session")
def gpu_image(docker_engine) -> str:
    if os.environ.get("RLP_TEST_GPU_IMAGE", "1") == "0":
        pytest.skip("RLP_TEST_GPU_IMAGE=0")
    return build("gpu")


def inspect(tag: str) -> dict:
    return json.loads(docker("image", "inspect", tag).stdout)[0]


def in_image(tag: str, script: str, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `sh -c script` in a hardened container of `tag` (through the image's entrypoint)."""
    return docker("run", "--rm", *HARDENED, *extra, tag, "sh", "-c", script, timeout=timeout)


# ------------------------------------------------------------------------------------------------ trainer run


@dataclass
class TrainerRun:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    host_dir: Path
    summary: dict = field(default_factory=dict)

    def checkpoint_on_host(self) -> Path:
        # The container wrote under /work, which is host_dir.
        rel = Path(self.summary["checkpoint"]).relative_to("/work")
        return self.host_dir / rel


@pytest.fixture(scope="session")
def trainer_run(cpu_image, tmp_path_factory) -> TrainerRun:
    """One tiny CartPole PPO iteration in the CPU image, written to a host folder mounted at /work."""
    host = tmp_path_factory.mktemp("trainer-out")
    os.chown(host, 1000, 100) if os.geteuid() == 0 else host.chmod(0o777)
    name = f"rlp-test-train-{uuid.uuid4().hex[:8]}"
    t = time.monotonic()
    p = docker(
        "run", "--rm", "--name", name, *HARDENED, "-v", f"{host}:/work",
        cpu_image, "python", "-m", "trainer", "stop.iterations=1", "output_dir=/work/out",
        timeout=900, check=False,
    )
    run_ = TrainerRun(p.returncode, p.stdout, p.stderr, time.monotonic() - t, host)
    lines = [ln for ln in p.stdout.strip().splitlines() if ln.strip()]
    if p.returncode == 0 and lines:
        try:
            run_.summary = json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    print(f"\n[containers] trainer smoke run: {run_.wall_s:.1f} s, exit {p.returncode}")
    return run_


# ------------------------------------------------------------------------------------------------ serving


def http(url: str, data: dict | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method="POST" if data is not None else "GET")
    body = None
    if data is not None:
        body = json.dumps(data).encode()
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, body, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass
class ServeContainer:
    name: str
    api: str
    metrics: str
    ready_s: float

    def logs(self) -> str:
        p = docker("logs", "--tail", "80", self.name, check=False)
        return p.stdout + p.stderr


def host_port(name: str, port: int) -> int:
    out = docker("port", name, f"{port}/tcp").stdout.strip().splitlines()[0]
    host, _, hp = out.rpartition(":")
    assert host == "127.0.0.1", out  # published on loopback only
    return int(hp)


@pytest.fixture(scope="module")
def serve_container(cpu_image, trainer_run) -> ServeContainer:
    """The CPU image serving the smoke run's checkpoint (mounted read-only), ports published on 127.0.0.1. Removed
    after its module: a Serve instance left running until the session's end costs the suites after it CPU."""
    assert trainer_run.returncode == 0 and trainer_run.summary, "the trainer smoke run failed; nothing to serve"
    ckpt = trainer_run.checkpoint_on_host()
    name = f"rlp-test-serve-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    docker(
        "run", "-d", "--name", name, *HARDENED,
        "-v", f"{ckpt}:/ckpt:ro",
        "-p", "127.0.0.1::8000", "-p", "127.0.0.1::8080",
        cpu_image, "rlp-serve", "--checkpoint", "/ckpt",
    )
    try:
        api = f"http://127.0.0.1:{host_port(name, 8000)}"
        metrics = f"http://127.0.0.1:{host_port(name, 8080)}"

        def ready():
            state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
            assert state["Running"], f"serving container exited: {state}"
            return http(api + "/readyz", timeout=2)[0] == 200

        def diagnose() -> str:
            logs = docker("logs", "--tail", "80", name, check=False)
            try:
                readyz = http(api + "/readyz", timeout=2)
            except Exception as e:  # noqa: BLE001
                readyz = repr(e)
            return f"/readyz: {readyz}\n--- container stdout ---\n{logs.stdout}\n--- container stderr ---\n{logs.stderr}"

        wait_for(ready, 240, "/readyz of the serving container", on_timeout=diagnose)
        sc = ServeContainer(name, api, metrics, time.monotonic() - t0)
        print(f"\n[containers] serve container start-to-ready: {sc.ready_s:.1f} s")
        yield sc
    finally:
        docker("rm", "-f", name, check=False)
