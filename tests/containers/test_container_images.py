"""The container images (Dockerfile.cpu / Dockerfile.gpu) built and run with a real Docker engine.

Run: `make test-containers` or `.venv/bin/python -m pytest tests/containers -m docker`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re

import pytest

from rl_checkpoint import resolve
from containerkit import (
    HARDENED,
    IMAGES_SH,
    MEMORY,
    ROOT,
    docker,
    http,
    in_image,
    inspect,
    run,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]

# ------------------------------------------------------------------------------------------------ engine


def test_engine_bridge_is_in_the_benchmarking_range(docker_engine):
    """The containers below run on the engine's default bridge: its addresses come from 198.18.0.0/15 like the
    cluster tier's (hack/cluster/common.sh DOCKER_BRIDGE_IP), never Docker's private 172.17.0.0/16 default."""
    configs = json.loads(docker("network", "inspect", "bridge", "-f", "{{json .IPAM.Config}}").stdout)
    subnets = [ipaddress.ip_network(c["Subnet"]) for c in configs if c.get("Subnet")]
    assert subnets, f"the engine's bridge network has no subnet: {configs}"
    outside = [str(n) for n in subnets if n.version == 4 and not n.subnet_of(ipaddress.ip_network("198.18.0.0/15"))]
    assert not outside, (f"the Docker engine's bridge is {outside}, outside 198.18.0.0/15: it was not started by "
                         "hack/images.sh (--bip/--default-address-pool); stop it and run `hack/images.sh dockerd`")


# ------------------------------------------------------------------------------------------------ image metadata


def test_cpu_image_config(cpu_image):
    img = inspect(cpu_image)
    cfg = img["Config"]
    # Numeric non-root user (Kubernetes' runAsNonRoot can verify a numeric USER only), uid 1000 like Ray's images.
    assert cfg["User"] == "1000:100"
    assert cfg["Entrypoint"][:2] == ["/usr/bin/tini", "--"]
    assert {"8000/tcp", "8080/tcp"} <= set(cfg["ExposedPorts"])
    hc = cfg["Healthcheck"]["Test"]
    assert hc[0] == "CMD" and hc[-1] == "/usr/local/bin/rlp-healthcheck"
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert "PIP_CERT" not in env and "REQUESTS_CA_BUNDLE" not in env
    assert cfg["Labels"]["ai.rl-platform.flavour"] == "cpu"
    # The image is a few layers: no layer of the final stage copied docker/certs.
    hist = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", cpu_image).stdout
    assert "certs" not in hist and "pip-ca" not in hist
    size_gb = img["Size"] / 1e9
    print(f"\n[containers] {cpu_image}: {size_gb:.2f} GB")
    # PyPI's torch is the CUDA build; docker/prune_cpu.py keeps it near 4.7 GB. A regression (e.g. triton or all of
    # cuDNN back in the image) shows here.
    assert size_gb < 5.2, f"{cpu_image} is {size_gb:.2f} GB"


def test_cpu_image_contents(cpu_image):
    """Python 3.11 venv with the project's pins, headless OpenCV, ALE ROMs, no build tools, no CA bundle."""
    script = r"""
set -e
id -u; id -g
python - <<'EOF'
import importlib.metadata as md, json, os, sys
import cv2, gymnasium as gym, ale_py, torch, ray, trainer, serving, rl_envs, rl_checkpoint
gym.register_envs(ale_py)
env = gym.make("ALE/Pong-v5")            # the ROM ships inside ale-py: no download
obs, _ = env.reset(seed=0)
dists = {d.metadata["Name"].lower() for d in md.distributions()}
print(json.dumps({
    "python": list(sys.version_info[:2]),
    "versions": {n: md.version(n) for n in ("ray", "torch", "gymnasium", "ale-py", "opencv-python-headless", "hydra-core")},
    "gui_opencv": sorted(d for d in dists if d in ("opencv-python", "opencv-contrib-python")),
    "pong_obs": list(obs.shape),
    "cuda": torch.cuda.is_available(),
    "triton": "triton" in dists,
    "site": os.path.dirname(trainer.__file__),
    "hydra_conf": os.path.isfile(os.path.join(os.path.dirname(trainer.__file__), "..", "hydra_conf", "config.yaml")),
}))
EOF
for t in gcc cc g++ make ld as; do if command -v $t >/dev/null; then echo "BUILD TOOL $t"; fi; done
dpkg-query -W -f '${Package}\n' | grep -E -- '-dev$|^build-essential$|^gcc(-[0-9]+)?$|^g\+\+|^cpp|^binutils|^make$' | sed 's/^/DEV PACKAGE /' || true
for p in /tmp/pip-ca.pem /tmp/certs /opt/venv/extra-ca.crt; do [ -e "$p" ] && echo "LEAK $p"; done
find / -xdev \( -name 'extra-ca.crt' -o -name 'pip-ca.pem' \) 2>/dev/null | sed 's/^/LEAK /'
true
"""
    out = in_image(cpu_image, script).stdout
    lines = out.strip().splitlines()
    assert lines[0] == "1000" and lines[1] == "100"
    info = json.loads(next(ln for ln in lines if ln.startswith("{")))
    assert info["python"] == [3, 11]
    assert info["versions"]["ray"] == "2.58.0"
    assert info["versions"]["torch"].split("+")[0] == "2.13.0"
    assert info["versions"]["gymnasium"] == "1.2.2" and info["versions"]["ale-py"] == "0.12.1"
    assert info["gui_opencv"] == []
    assert info["pong_obs"] == [210, 160, 3]
    assert info["cuda"] is False and info["triton"] is False
    assert info["hydra_conf"], "python -m trainer needs hydra_conf/ beside the installed package"
    bad = [ln for ln in lines if ln.startswith(("BUILD TOOL", "DEV PACKAGE", "LEAK"))]
    assert bad == []


def test_read_only_root_and_home(cpu_image):
    """Read-only rootfs: the entrypoint moves HOME to /tmp/home; the image's files cannot be changed."""
    out = in_image(
        cpu_image,
        'echo "HOME=$HOME"; test -w "$HOME" && echo home-writable; '
        "touch /opt/venv/x 2>/dev/null && echo rootfs-writable; touch /home/ray/x 2>/dev/null && echo homedir-writable; "
        "python -c 'import matplotlib, os; print(\"mpl=\" + matplotlib.get_configdir())'",
    ).stdout
    assert "HOME=/tmp/home" in out and "home-writable" in out
    assert "rootfs-writable" not in out and "homedir-writable" not in out
    assert "mpl=/tmp/home/" in out


def test_healthcheck_roles(cpu_image):
    """The HEALTHCHECK probes serving containers only; it fails when the server does not answer."""
    hc = "python3 -I /usr/local/bin/rlp-healthcheck"
    # A trainer/other container: nothing to probe, healthy.
    p = docker("run", "--rm", *HARDENED, cpu_image, "sh", "-c", f"{hc}; echo rc=$?")
    assert "rc=0" in p.stdout and "not a serving container" in p.stdout
    # Forced HTTP probe with no server listening: unhealthy.
    p = docker("run", "--rm", *HARDENED, "-e", "RLP_HEALTHCHECK=http", cpu_image, "sh", "-c", f"{hc}; echo rc=$?")
    assert "rc=1" in p.stdout and "8000/healthz" in p.stdout


def test_kuberay_style_ray_head(cpu_image):
    """What a KubeRay pod runs: its `command` replaces the entrypoint with `/bin/bash -lc -- "ulimit ...; ray start
    ..."`, and its default probes exec `wget` against the raylet and GCS health endpoints. A login shell resets
    PATH (Debian's /etc/profile): /etc/profile.d/rl-platform.sh must bring /opt/venv/bin and a writable HOME back."""
    script = (
        "ulimit -n 65536 2>/dev/null; echo HOME=$HOME; "
        "ray start --head --dashboard-host=0.0.0.0 --metrics-export-port=8080 --num-cpus=1 --disable-usage-stats "
        ">/tmp/start.log 2>&1 || { cat /tmp/start.log; exit 3; }; "
        "ok=0; for i in $(seq 60); do "
        "wget --tries 1 -T 2 -q -O- http://127.0.0.1:52365/api/local_raylet_healthz | grep -q success && "
        "wget --tries 1 -T 2 -q -O- http://127.0.0.1:8265/api/gcs_healthz | grep -q success && { ok=1; break; }; "
        "sleep 1; done; echo probes=$ok; "
        "python -c 'import ray; ray.init(address=\"auto\"); print(\"cpus=%d\" % ray.cluster_resources()[\"CPU\"])'; "
        "ray stop --force >/dev/null 2>&1"
    )
    out = docker("run", "--rm", *HARDENED, "--entrypoint", "/bin/bash", cpu_image, "-lc", "--", script,
                 timeout=300).stdout
    assert "HOME=/tmp/home" in out
    assert "probes=1" in out, out
    assert "cpus=1" in out, out


# ------------------------------------------------------------------------------------------------ trainer


def test_trainer_cartpole_smoke(trainer_run):
    """`python -m trainer stop.iterations=1` in the CPU image under --cpus 2 --memory, read-only, non-root."""
    assert trainer_run.returncode == 0, f"stdout:\n{trainer_run.stdout[-3000:]}\nstderr:\n{trainer_run.stderr[-5000:]}"
    s = trainer_run.summary
    assert s, f"the last stdout line is not the JSON summary:\n{trainer_run.stdout[-2000:]}"
    assert s["checkpoint"].startswith("/work/out/")
    assert s["env_steps"] > 0 and s["iterations"] == 1
    ckpt = trainer_run.checkpoint_on_host()
    assert (ckpt / "rllib_checkpoint.json").is_file()
    assert resolve(str(ckpt)).module_rel  # an Algorithm checkpoint holding the RLModule (raises if partial)
    # Written by the image's non-root user.
    assert ckpt.stat().st_uid == 1000
    print(f"\n[containers] trainer smoke: {trainer_run.wall_s:.1f} s in the container (memory limit {MEMORY})")


# ------------------------------------------------------------------------------------------------ serving


def test_serving_container_answers(serve_container, trainer_run):
    sc = serve_container
    code, body = http(sc.api + "/healthz")
    assert code == 200 and json.loads(body)["status"] == "ok"
    assert http(sc.api + "/readyz")[0] == 200
    obs = [0.01, -0.02, 0.03, 0.04]
    code, body = http(sc.api + "/v1/policies/default/act", {"observation": obs})
    assert code == 200, body
    reply = json.loads(body)
    assert reply["policy"] == "default"
    # The container's answer is the greedy action of the checkpoint's RLModule, computed here on the host.
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str(resolve(str(trainer_run.checkpoint_on_host())).local_module_dir()[0]))
    with torch.no_grad():
        logits = module.forward_inference({"obs": torch.tensor([obs], dtype=torch.float32)})["action_dist_inputs"]
    assert reply["action"] == int(logits.argmax(-1)[0]), (reply, logits)
    # A malformed request is the client's error, named, not a crash.
    code, body = http(sc.api + "/v1/policies/default/act", {"observation": [0.0]})
    assert code == 422 and json.loads(body)["error"]["code"] == "bad_shape", body
    print(f"\n[containers] serve container start-to-ready: {sc.ready_s:.1f} s")


def test_serving_container_metrics(serve_container):
    sc = serve_container
    http(sc.api + "/v1/policies/default/act", {"observation": [0.0, 0.0, 0.0, 0.0]})

    def scraped():
        code, body = http(sc.metrics + "/metrics")
        text = body.decode()
        return code == 200 and "ray_serve_" in text and text

    def ours():
        text = scraped()
        return text and "ray_rl_serve_requests_total" in text and "ray_rl_serve_policy_info" in text and text

    text = wait_for(ours, 60, "ray_serve_* and ray_rl_serve_* metrics on :8080", interval=1.0)
    names = {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln.startswith("ray_")}
    assert any(n.startswith("ray_serve_") for n in names)
    assert {"ray_rl_serve_requests_total", "ray_rl_serve_policy_info", "ray_rl_serve_batch_size_bucket"} <= names, names
    assert len(names) > 20


def test_serving_container_is_hardened_and_healthy(serve_container):
    sc = serve_container
    assert docker("exec", sc.name, "id", "-u").stdout.strip() == "1000"
    p = docker("exec", sc.name, "sh", "-c", "touch /opt/venv/x", check=False)
    assert p.returncode != 0 and "Read-only file system" in p.stderr
    hc = json.loads(docker("inspect", "-f", "{{json .Config.Healthcheck}}", sc.name).stdout)
    assert hc["Test"][-1] == "/usr/local/bin/rlp-healthcheck"

    # Docker's own HEALTHCHECK (interval 10 s) turns "healthy" once /healthz answers.
    # wait_for keeps polling through exceptions, so "unhealthy" ends the wait as a value, asserted after it.
    def settled():
        st = docker("inspect", "-f", "{{.State.Health.Status}}", sc.name).stdout.strip()
        return st if st in ("healthy", "unhealthy") else None

    status = wait_for(settled, 60, "docker health status 'healthy'", interval=1.0, on_timeout=sc.logs)
    assert status == "healthy", f"docker reports the serving container {status}:\n{sc.logs()}"


# ------------------------------------------------------------------------------------------------ build plumbing


def test_pip_in_build_uses_staged_ca_and_leaves_no_trace(docker_engine):
    """pip inside a build reaches the index through the CA bundle hack/images.sh stages (RLP_CA_BUNDLE / host
    bundle); the bundle is removed from docker/certs afterwards and is in no layer of the final stage."""
    staged = ROOT / "docker" / "certs" / "extra-ca.crt"
    p = run([str(IMAGES_SH), "pipcheck"], cwd=ROOT, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-4000:]
    assert not staged.exists()
    tag = os.environ.get("PIPCHECK_IMAGE", "rl-platform-pipcheck:latest")
    files = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                   "ls /wheels; find / -xdev \\( -name '*.crt' -path '*certs*' -o -name 'pip-ca.pem' \\) "
                   "-newer /wheels 2>/dev/null; ls /tmp").stdout
    assert "prometheus_client-" in files
    assert "pip-ca.pem" not in files and "extra-ca.crt" not in files
    hist = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", tag).stdout
    assert "certs" not in hist
    # Negative control: without the bundle pip either still works (no interception on this machine) or fails
    # on certificate verification, which is what the bundle is for; nothing else is acceptable.
    neg = run([str(IMAGES_SH), "pipcheck"], cwd=ROOT, timeout=900, check=False,
              env={**os.environ, "RLP_CA_BUNDLE": "none", "PIP_CERT": ""})
    if neg.returncode != 0:
        assert "CERTIFICATE_VERIFY_FAILED" in neg.stderr, neg.stderr[-3000:]
    assert not staged.exists()


def test_warm_rebuild_is_cached(cpu_image):
    """A second build with nothing changed takes every RUN/COPY step from the cache (no pip install again)."""
    if os.environ.get("RLP_SKIP_IMAGE_BUILD") == "1":
        pytest.skip("RLP_SKIP_IMAGE_BUILD=1")
    p = run([str(IMAGES_SH), "build", "cpu"], cwd=ROOT, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    steps, current = [], None
    for ln in p.stderr.splitlines():
        m = re.search(r"Step \d+/\d+ : (\S+)", ln)
        if m:
            current = [m.group(1), ln, None]
            steps.append(current)
        elif current is not None and current[2] is None and ("Using cache" in ln or "Running in" in ln):
            current[2] = "cached" if "Using cache" in ln else "ran"
    assert len(steps) > 20, p.stderr[-3000:]
    # The dependency stages must come from the cache. The project's own stage (`COPY . /tmp/src` onwards) is
    # rebuilt only when a file of the build context changed meanwhile (someone editing the tree).
    deps = [s for s in steps if s[0] in ("RUN", "COPY") and
            ("pip install" in s[1] and "WHEELHOUSE_URL" in s[1] or "prune_cpu" in s[1] or "/opt/venv /opt/venv" in s[1]
             or "apt-get" in s[1])]
    assert len(deps) >= 5, [s[1] for s in steps]
    assert [s[1] for s in deps if s[2] != "cached"] == []


def test_kind_load(cpu_image, tmp_path):
    """`make kind-load`: a no-op without a cluster; with one, `kind load docker-image` for each built image.
    (kind needs a node image from a registry, so a stand-in kind records the calls here.)"""
    calls = tmp_path / "calls"
    fake = tmp_path / "kind"
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
[ "$1 $2" = "get clusters" ] && echo rl-platform
exit 0
""")
    fake.chmod(0o755)
    env = {**os.environ, "KIND": str(fake)}
    p = run([str(IMAGES_SH), "kind-load"], cwd=ROOT, timeout=120, check=False, env={**env, "KIND_CLUSTER": "other"})
    assert p.returncode == 0 and "nothing to do" in p.stderr, p.stderr
    assert "load" not in calls.read_text()
    p = run(["make", "--no-print-directory", "kind-load"], cwd=ROOT, timeout=120, check=False, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    loads = [ln for ln in calls.read_text().splitlines() if ln.startswith("load ")]
    assert f"load docker-image {cpu_image} --name rl-platform" in loads
    gpu_built = docker("image", "inspect", cpu_image.replace("-cpu", "-gpu"), check=False).returncode == 0
    assert len(loads) == (2 if gpu_built else 1), loads


# ------------------------------------------------------------------------------------------------ GPU image


def test_gpu_image(gpu_image, cpu_image):
    """The GPU image carries the CUDA build of torch and its CUDA libraries (and triton); it shares the dependency
    stages with the CPU image. No GPU here: CUDA is compiled in, not available. RLP_TEST_GPU_IMAGE=0 skips it."""
    img = inspect(gpu_image)
    env = dict(e.split("=", 1) for e in img["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert img["Config"]["User"] == "1000:100"
    out = in_image(gpu_image, "python -c \"import json, torch, triton, ray; print(json.dumps("
                              "{'cuda_build': torch.version.cuda, 'cudnn': torch.backends.cudnn.version(), "
                              "'available': torch.cuda.is_available()}))\"").stdout
    info = json.loads(out.strip().splitlines()[-1])
    assert info["cuda_build"] and info["cudnn"] and info["available"] is False
    # Same code and configs as the CPU image; the trainer composes its config.
    out = in_image(gpu_image, "python -m trainer --cfg job stop.iterations=1").stdout
    assert "experiment:" in out and "iterations: 1" in out
    # Built from the same cached stages: base and runtime-apt layers are shared with the CPU image.
    assert img["RootFS"]["Layers"][:2] == inspect(cpu_image)["RootFS"]["Layers"][:2]
    print(f"\n[containers] {gpu_image}: {img['Size'] / 1e9:.2f} GB")


def test_direct_build_through_the_index(docker_engine):
    """Opt-in (RLP_TEST_DIRECT_BUILD=1; downloads ~3 GB): no wheelhouse, pip inside the build uses the index
    through the staged CA bundle."""
    if os.environ.get("RLP_TEST_DIRECT_BUILD") != "1":
        pytest.skip("opt-in: RLP_TEST_DIRECT_BUILD=1")
    tag = "rl-platform:direct-build-test"
    p = run([str(IMAGES_SH), "build", "cpu"], cwd=ROOT, timeout=3000, check=False,
            env={**os.environ, "RLP_WHEELHOUSE": "0", "IMAGE_CPU": tag})
    try:
        assert p.returncode == 0, p.stderr[-4000:]
        assert not (ROOT / "docker" / "certs" / "extra-ca.crt").exists()
        out = in_image(tag, "python -c 'import torch, ray; print(ray.__version__)'; ls /tmp /opt/venv").stdout
        assert "2.58.0" in out and "pip-ca.pem" not in out
        hist = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", tag).stdout
        assert "certs" not in hist
    finally:
        docker("rmi", tag, check=False)
