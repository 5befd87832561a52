"""`rl-submit` against the real API server and KubeRay operator of the cluster tier (Level A: KWOK fake nodes).

What Level A can show: the RayJob the chart renders is accepted, the operator creates its RayCluster, the scheduler
places the pods, KWOK marks them Running and completes the submitter Job's pod; with no Ray in the pods the
operator then fails the job ("submitter finished but the ray job did not reach terminal state within 30s"), so the
watch ends FAILED there (exit 4) -- the states it passed on the way are asserted. --detach, status, stop, Ctrl-C,
--timeout and every error a user meets are run against real servers: RBAC with ServiceAccount tokens (TokenRequest),
KubeRay missing on a second API server without its CRDs, ResourceQuotas in a scratch namespace, a missing namespace.
Unreachable servers and a missing kubeconfig need no cluster: tests/unit/test_submit.py.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import selectors
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kubekit import NAMESPACE, RAY, ROOT, Cluster, dump, sh, wait_until
from trainer_helpers import free_port

RL_SUBMIT = ROOT / ".venv" / "bin" / "rl-submit"
PREFIX = "rl-platform-sub-"  # every RayJob this module creates (the chart's <release>- prefix + sub-...)
SCRATCH = "rl-submit-scratch"  # a namespace of our own for the quota cases


def rl_submit(c: Cluster, *args: str, kubeconfig: str | None = None, timeout: float = 300,
              check: int | None = None) -> subprocess.CompletedProcess:
    """The console script as a user runs it, against this cluster's kubeconfig (or `kubeconfig`)."""
    cmd = [str(RL_SUBMIT)] if RL_SUBMIT.exists() else [str(ROOT / ".venv" / "bin" / "python"), "-m", "rl_submit"]
    env = {**os.environ, **c.env, "KUBECONFIG": kubeconfig or c.kubeconfig}
    proc = subprocess.run(cmd + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, f"rl-submit {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def popen(c: Cluster, *args: str) -> subprocess.Popen:
    cmd = [str(RL_SUBMIT)] if RL_SUBMIT.exists() else [str(ROOT / ".venv" / "bin" / "python"), "-m", "rl_submit"]
    # SIGINT as in a terminal: a runner that starts the suite in the background (`cmd &`) hands its children SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler (Ctrl-C would do nothing).
    return subprocess.Popen(cmd + list(args), cwd=ROOT, env={**os.environ, **c.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stderr_until(proc: subprocess.Popen, pred, timeout: float) -> str:
    """Read proc's stderr line by line until a line satisfies `pred`; return what was read."""
    # Raw reads of the pipe (not the text wrapper, whose buffer select() cannot see); communicate() reads on after.
    got, deadline, fd = b"", time.monotonic() + timeout, proc.stderr.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"rl-submit exited {proc.wait()} early:\n{got.decode(errors='replace')}")
            got += chunk
            if any(pred(line) for line in got.decode(errors="replace").splitlines()):
                return got.decode(errors="replace")
    raise AssertionError(f"no expected line on rl-submit's stderr within {timeout}s:\n{got.decode(errors='replace')}")


def one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exit `code`, exactly one `error: ...` line on stderr holding every needle, nothing on stdout, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}, want {code}:\n{proc.stdout[-2000:]}\n{err[-3000:]}"
    assert proc.stdout == "" and len(err.splitlines()) == 1 and err.startswith("error: "), err
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"
    return err


def rayjob_or_none(c: Cluster, name: str, namespace: str = NAMESPACE) -> dict | None:
    try:
        return c.custom.get_namespaced_custom_object(*RAY, namespace, "rayjobs", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def summary(proc) -> dict:
    """The JSON object rl-submit prints as its last stdout line after watching."""
    return json.loads(proc.stdout.strip().splitlines()[-1])


def contains(got, want) -> bool:
    """`want` is in `got`, which may hold more (the defaults of the KubeRay CRD schema: numOfHosts, scaleStrategy)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and contains(got[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(contains, got, want))
    return got == want


def is_level_a(c: Cluster) -> bool:
    return c.kind == "local" and c.level == "a"


@pytest.fixture(scope="module")
def c(cluster_a: Cluster):
    yield cluster_a
    for job in cluster_a.ray_list("rayjobs"):
        if job["metadata"]["name"].startswith(PREFIX):
            cluster_a.delete_ray("rayjobs", job["metadata"]["name"], wait_pods=False)


# -- submit and watch ----------------------------------------------------------------------------------------------
def test_submit_watches_to_the_state_level_a_reaches(c: Cluster):
    name = PREFIX + "watch"
    dry = rl_submit(c, "--dry-run", "--name", "sub-watch", "stop.iterations=1", check=0)
    t0 = time.monotonic()
    proc = rl_submit(c, "--name", "sub-watch", "stop.iterations=1", "--timeout", "240", timeout=300)
    wall = time.monotonic() - t0
    assert "Traceback" not in proc.stderr, proc.stderr
    s = summary(proc)
    # What the operator got is what --dry-run printed: the chart's RayJob with the overrides.
    job = rayjob_or_none(c, name)
    assert job is not None and contains(job["spec"], yaml.safe_load(dry.stdout)["spec"]), dump(job["spec"])
    assert shlex.split(job["spec"]["entrypoint"])[-1] == "stop.iterations=1"
    err = proc.stderr
    assert f"rayjob/{name} created in namespace {NAMESPACE}" in err
    cluster = job["status"]["rayClusterName"]
    assert f"created RayCluster {cluster}" in err and cluster.startswith(name)
    rc = c.ray("rayclusters", cluster)  # the job's own cluster, shaped by k8s/values/cartpole.yaml
    assert {g["groupName"] for g in rc["spec"]["workerGroupSpecs"]} == {"rollout-cpu", "learner-cpu"}
    assert "Ray pods: 3/3 running" in err, err
    assert set(s["timeline_s"]) >= {"raycluster", "ray_pods_running", "submitter_started", "terminal"}, s
    if is_level_a(c):
        # KWOK completes the submitter pod; no Ray answers, so the operator fails the job 30 s later.
        assert "submitter pod " in err and " Succeeded" in err, err
        assert (proc.returncode, s["jobDeploymentStatus"], s["jobStatus"]) == (4, "Failed", "FAILED"), err
        assert s["reason"] == "JobDeploymentStatusTransitionGracePeriodExceeded", s
        # KWOK runs no kubelet server: the log is unavailable, said in one line, and the watch goes on.
        assert f"logs of pod {name}-" in err and "unavailable" in err, err
    else:
        assert proc.returncode in (0, 4), err
    t = s["timeline_s"]
    c.figures.update({"rl_submit_to_raycluster_s": t["raycluster"], "rl_submit_to_ray_pods_running_s": t["ray_pods_running"],
                      "rl_submit_to_submitter_started_s": t["submitter_started"], "rl_submit_to_terminal_s": t["terminal"],
                      "rl_submit_watch_wall_s": round(wall, 1)})
    rl_submit(c, "stop", name, check=0)


def test_detach_then_status_and_stop(c: Cluster):
    name = PREFIX + "detach"
    t0 = time.monotonic()
    proc = rl_submit(c, "--detach", "--name", "sub-detach", "stop.iterations=1", check=0)
    c.figures["rl_submit_detach_wall_s"] = round(time.monotonic() - t0, 1)
    assert proc.stdout.strip() == name, proc.stdout
    assert f"rl-submit stop {name} -n {NAMESPACE}" in proc.stderr, proc.stderr
    assert rayjob_or_none(c, name) is not None
    one_line_error(rl_submit(c, "--detach", "--name", "sub-detach"), 3,
                   f'rayjobs.ray.io "{name}" already exists in namespace \'{NAMESPACE}\' (choose another --name')

    cluster = wait_until(f"RayJob {name} to get its RayCluster",
                         lambda: (rayjob_or_none(c, name) or {}).get("status", {}).get("rayClusterName"), 120)
    st = rl_submit(c, "status", name, check=0)
    assert st.stdout.startswith(f"{name}: ") and f"RayCluster {cluster}" in st.stdout, st.stdout

    t0 = time.monotonic()
    rl_submit(c, "stop", name, check=0)
    wait_until(f"RayJob {name} to be deleted", lambda: rayjob_or_none(c, name) is None, 120)
    wait_until(f"its RayCluster {cluster} to go", lambda: not [r for r in c.ray_list("rayclusters")
                                                               if r["metadata"]["name"] == cluster], 120)
    c.figures["rl_submit_stop_to_raycluster_gone_s"] = round(time.monotonic() - t0, 1)
    one_line_error(rl_submit(c, "status", name), 3, f"no RayJob '{name}' in namespace '{NAMESPACE}'")


def test_stop_while_watching_ends_the_watch_as_stopped(c: Cluster):
    name = PREFIX + "stopped"
    watch = popen(c, "--name", "sub-stopped", "stop.iterations=1")
    try:
        wait_until(f"RayJob {name} to run", lambda: (rayjob_or_none(c, name) or {}).get("status", {})
                   .get("jobDeploymentStatus") == "Running", 120)
        rl_submit(c, "stop", name, check=0)
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 5, err
    assert f"RayJob {name} was deleted" in err and "Traceback" not in err, err


def test_ctrl_c_stops_watching_and_leaves_the_job_running(c: Cluster):
    name = PREFIX + "ctrlc"
    watch = popen(c, "--name", "sub-ctrlc", "stop.iterations=1")
    try:
        # Ctrl-C once the watch runs: its first status line ("rl-submit [  0.0s] RayJob ...") is on stderr.
        seen = _stderr_until(watch, lambda line: line.startswith("rl-submit [") and "RayJob" in line, 120)
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=60)
        err = seen + err
    finally:
        watch.kill()
    assert watch.returncode == 130, err
    assert f"RayJob {name} keeps running" in err and "Traceback" not in err, err
    for cmd in ("status", "logs", "stop"):
        assert f"rl-submit {cmd} {name} -n {NAMESPACE}" in err, err
    assert rayjob_or_none(c, name) is not None
    rl_submit(c, "stop", name, check=0)


def test_timeout_ends_the_watch_and_leaves_the_job(c: Cluster):
    name = PREFIX + "timeout"
    proc = rl_submit(c, "--name", "sub-timeout", "--timeout", "3", "stop.iterations=1", timeout=120)
    assert proc.returncode == 6, proc.stderr
    assert "after --timeout 3s; the job keeps running" in proc.stderr, proc.stderr
    assert rayjob_or_none(c, name) is not None
    rl_submit(c, "stop", name, check=0)


def test_use_existing_cluster_runs_on_the_release_raycluster(c: Cluster):
    name = PREFIX + "shared"
    rl_submit(c, "--detach", "--use-existing-cluster", "--name", "sub-shared", "stop.iterations=1", check=0)
    job = rayjob_or_none(c, name)
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "rl-platform"} and "rayClusterSpec" not in job["spec"]
    wait_until(f"RayJob {name} to run on RayCluster rl-platform",
               lambda: (rayjob_or_none(c, name) or {}).get("status", {}).get("rayClusterName") == "rl-platform", 120)
    assert not [r for r in c.ray_list("rayclusters") if r["metadata"]["name"].startswith(name)]
    rl_submit(c, "stop", name, check=0)
    err = one_line_error(rl_submit(c, "--cluster-selector", "no-such-cluster", "--name", "sub-nocluster"), 3,
                         "no RayCluster 'no-such-cluster' in namespace 'rl-platform'")
    assert rayjob_or_none(c, PREFIX + "nocluster") is None, err


@pytest.mark.parametrize("override, code, needle", [
    ("algo.lr=fast", 1, "full_key: algo.lr"),
    ("stop.env_steps=0", 2, "error: stop.env_steps must be > 0, got 0"),
])
def test_bad_config_creates_nothing(c: Cluster, override, code, needle):
    proc = rl_submit(c, "--name", "sub-bad", override)
    assert proc.returncode == code and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "created" not in proc.stderr
    assert rayjob_or_none(c, PREFIX + "bad") is None


# -- errors from real servers ----------------------------------------------------------------------------------------
def _sa_kubeconfig(c: Cluster, sa: str, path: Path) -> str:
    """A kubeconfig for ServiceAccount `sa` with a TokenRequest token, as a CI system or a teammate would get."""
    token = c.core.create_namespaced_service_account_token(sa, NAMESPACE, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    admin = yaml.safe_load(Path(c.kubeconfig).read_text())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": sa,
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "c", "user": sa, "namespace": NAMESPACE}}]}))
    return str(path)


def _role(name: str, rules: list[tuple[str, str, list[str]]]) -> client.V1Role:
    return client.V1Role(metadata=client.V1ObjectMeta(name=name), rules=[
        client.V1PolicyRule(api_groups=[g], resources=[r], verbs=v) for g, r, v in rules])


@pytest.fixture(scope="module")
def service_accounts(c: Cluster, tmp_path_factory):
    """viewer: may read RayJobs only. submitter: the least a user of rl-submit needs, minus events (to see the watch
    do without them): create/get/delete rayjobs, get/list pods, get rayclusters."""
    rbac = client.RbacAuthorizationV1Api(c.api_client)
    roles = {
        "rl-submit-viewer": [("ray.io", "rayjobs", ["get", "list", "watch"])],
        "rl-submit-user": [("ray.io", "rayjobs", ["create", "get", "delete"]), ("", "pods", ["get", "list"]),
                           ("ray.io", "rayclusters", ["get"])],
    }
    out = {}
    for sa, rules in roles.items():
        for create, body in ((c.core.create_namespaced_service_account,
                              client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa))),
                             (rbac.create_namespaced_role, _role(sa, rules)),
                             (rbac.create_namespaced_role_binding, client.V1RoleBinding(
                                 metadata=client.V1ObjectMeta(name=sa),
                                 role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=sa),
                                 subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=NAMESPACE)]))):
            try:
                create(NAMESPACE, body)
            except ApiException as e:
                if e.status != 409:
                    raise
        out[sa] = _sa_kubeconfig(c, sa, tmp_path_factory.mktemp(sa) / "kubeconfig")
    yield out
    for sa in roles:
        for delete in (rbac.delete_namespaced_role_binding, rbac.delete_namespaced_role,
                       c.core.delete_namespaced_service_account):
            try:
                delete(sa, NAMESPACE)
            except ApiException:
                pass


def test_rbac_forbidden_names_the_user_verb_and_resource(c: Cluster, service_accounts):
    kc = service_accounts["rl-submit-viewer"]
    err = one_line_error(rl_submit(c, "--name", "sub-rbac", kubeconfig=kc), 3,
                         "forbidden by RBAC, cannot create rayjobs.ray.io in namespace 'rl-platform'",
                         'User "system:serviceaccount:rl-platform:rl-submit-viewer" cannot create resource "rayjobs" '
                         'in API group "ray.io" in the namespace "rl-platform"')
    assert rayjob_or_none(c, PREFIX + "rbac") is None, err
    # The viewer may look but not stop.
    rl_submit(c, "--detach", "--name", "sub-rbac2", check=0)
    one_line_error(rl_submit(c, "stop", PREFIX + "rbac2", kubeconfig=kc), 3, "cannot delete rayjobs.ray.io",
                   'cannot delete resource "rayjobs"')
    rl_submit(c, "stop", PREFIX + "rbac2", check=0)


def test_least_privileged_user_submits_watches_and_stops(c: Cluster, service_accounts):
    kc = service_accounts["rl-submit-user"]
    name = PREFIX + "user"
    proc = rl_submit(c, "--name", "sub-user", "--timeout", "8", "stop.iterations=1", kubeconfig=kc, timeout=120)
    # Events are not readable to this user: the watch says so once and goes on with status and pods.
    assert "not watching events: forbidden by RBAC" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.returncode in (4, 6), proc.stderr
    assert "Ray pods: 3/3 running" in proc.stderr, proc.stderr
    st = rl_submit(c, "status", name, kubeconfig=kc)
    assert st.returncode in (0, 4) and st.stdout.startswith(f"{name}: "), st.stderr
    rl_submit(c, "stop", name, kubeconfig=kc, check=0)
    wait_until(f"RayJob {name} to be deleted", lambda: rayjob_or_none(c, name) is None, 120)


def test_missing_namespace_is_named(c: Cluster):
    one_line_error(rl_submit(c, "-n", "rl-submit-no-such-ns", "--name", "sub-nons"), 3,
                   "namespace 'rl-submit-no-such-ns' does not exist")


def test_unknown_context_is_named(c: Cluster):
    one_line_error(rl_submit(c, "--context", "no-such-context", "--name", "sub-noctx"), 3, "kubeconfig:",
                   "no-such-context")


@pytest.fixture
def scratch(c: Cluster):
    """A namespace of our own with the ServiceAccount the chart's pods name; removed afterwards."""
    c.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=SCRATCH)))
    c.core.create_namespaced_service_account(SCRATCH, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="rl-platform")))
    yield SCRATCH
    for job in c.custom.list_namespaced_custom_object(*RAY, SCRATCH, "rayjobs")["items"]:
        c.custom.delete_namespaced_custom_object(*RAY, SCRATCH, "rayjobs", job["metadata"]["name"])
    c.core.delete_namespace(SCRATCH)
    wait_until(f"namespace {SCRATCH} to go", lambda: SCRATCH not in {n.metadata.name for n in c.core.list_namespace().items}, 180)


def _quota(c: Cluster, ns: str, hard: dict) -> None:
    c.core.create_namespaced_resource_quota(ns, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="rl-submit-test"), spec=client.V1ResourceQuotaSpec(hard=hard)))
    # The quota controller must have counted usage before admission enforces it.
    wait_until("the quota to be counted", lambda: c.core.read_namespaced_resource_quota("rl-submit-test", ns)
               .status.hard, 60)


def test_quota_on_rayjobs_refuses_the_submission(c: Cluster, scratch):
    _quota(c, scratch, {"count/rayjobs.ray.io": "0"})
    err = one_line_error(rl_submit(c, "-n", scratch, "--name", "sub-quota"), 3,
                         f"quota exceeded in namespace '{scratch}'", "exceeded quota: rl-submit-test")
    assert "count/rayjobs.ray.io" in err
    assert rayjob_or_none(c, PREFIX + "quota", scratch) is None


def test_quota_on_pods_stops_the_watch_when_the_operator_is_refused(c: Cluster, scratch):
    """The RayJob is accepted, but the operator may not create the Ray pods: the watch sees the refusal and ends."""
    _quota(c, scratch, {"requests.cpu": "600m", "limits.cpu": "3"})
    proc = rl_submit(c, "-n", scratch, "--name", "sub-podquota", "--timeout", "120", timeout=200)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr
    assert err[-1].startswith(f"error: quota exceeded in namespace '{scratch}': RayCluster {PREFIX}podquota-"), err[-1]
    assert "exceeded quota: rl-submit-test" in err[-1] and f"rl-submit stop {PREFIX}podquota -n {scratch}" in err[-1]
    assert rayjob_or_none(c, PREFIX + "podquota", scratch) is not None  # left for the user to inspect or stop


def test_image_that_cannot_be_pulled_stops_the_watch(c: Cluster):
    """imagePullPolicy Never with a tag no node has. Where a kubelet runs the pod (Level B, kind) it reports
    ErrImageNeverPull itself; KWOK nodes (Level A) pull nothing, so there the test writes exactly the status a kubelet
    writes for that case into the head pod (the status subresource, as the kubelet does), and the watch, reading
    the real API, must stop on it."""
    name = PREFIX + "image"
    watch = popen(c, "--name", "sub-image", "--set", "image.cpu.tag=no-such-tag", "--set", "image.pullPolicy=Never",
                  "--timeout", "240", "stop.iterations=1")
    try:
        if is_level_a(c):
            rc = wait_until(f"RayJob {name} to get its RayCluster",
                            lambda: (rayjob_or_none(c, name) or {}).get("status", {}).get("rayClusterName"), 120)
            head = wait_until("its head pod", lambda: c.pods(f"ray.io/cluster={rc},ray.io/node-type=head"), 120)[0]
            image = head.spec.containers[0].image
            assert image.endswith(":no-such-tag") and head.spec.containers[0].image_pull_policy == "Never"
            c.core.patch_namespaced_pod_status(head.metadata.name, NAMESPACE, {"status": {"phase": "Pending", "containerStatuses": [{
                "name": head.spec.containers[0].name, "image": image, "imageID": "", "ready": False, "restartCount": 0,
                "started": False, "state": {"waiting": {"reason": "ErrImageNeverPull", "message":
                    f'Container image "{image}" is not present with pull policy of Never'}}}]}})
        out, err = watch.communicate(timeout=200)
    finally:
        watch.kill()
    last = err.strip().splitlines()[-1]
    assert watch.returncode == 3, err
    assert last.startswith("error: image rl-platform:no-such-tag cannot be used by pod ") and "ErrImageNeverPull" in last, last
    rl_submit(c, "stop", name, check=0)


# -- KubeRay missing: a second, empty API server ----------------------------------------------------------------------
def _cluster_settings(c: Cluster) -> dict:
    """The tier's addresses as hack/cluster/common.sh sets them (honouring the same RLP_* environment)."""
    out = sh("bash", "-c", f"source {ROOT}/hack/cluster/common.sh; echo $ETCD_CLIENT_PORT $NODE_IP $SERVICE_CIDR").stdout.split()
    tools = dict(l.split("=", 1) for l in sh(str(ROOT / "hack" / "tools.sh"), "env").stdout.splitlines() if "=" in l)
    return {"etcd": int(out[0]), "node_ip": out[1], "service_cidr": out[2], "k8s_bin": tools["K8S_BIN"],
            "pki": Path(c.kubeconfig).parent / "pki"}


@pytest.fixture
def api_server_without_kuberay(c: Cluster, tmp_path):
    """The KubeRay CRDs of the shared cluster stay untouched: a second kube-apiserver of the same release, same CA
    and etcd, but its own etcd key prefix -- a real, empty cluster that serves no ray.io group. Removed afterwards
    with its keys."""
    if c.kind != "local":
        pytest.skip("starts a kube-apiserver from the local tier's binaries")
    s = _cluster_settings(c)
    pki, port, prefix = s["pki"], free_port(), f"/rl-submit-bare-{os.getpid()}"
    log = open(tmp_path / "apiserver.log", "w")
    proc = subprocess.Popen([
        f"{s['k8s_bin']}/kube-apiserver", "--etcd-servers", f"http://127.0.0.1:{s['etcd']}", "--etcd-prefix", prefix,
        "--bind-address", "127.0.0.1", "--secure-port", str(port), "--advertise-address", s["node_ip"],
        "--endpoint-reconciler-type", "none", "--tls-cert-file", f"{pki}/apiserver.crt",
        "--tls-private-key-file", f"{pki}/apiserver.key", "--client-ca-file", f"{pki}/ca.crt", "--anonymous-auth=false",
        "--authorization-mode", "RBAC", "--service-cluster-ip-range", s["service_cidr"],
        "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
        "--service-account-key-file", f"{pki}/sa.pub", "--service-account-signing-key-file", f"{pki}/sa.key",
        "--profiling=false"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    kc = yaml.safe_load(Path(c.kubeconfig).read_text())
    kc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = tmp_path / "bare.kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    api = client.VersionApi(config.new_client_from_config(config_file=str(path)))

    def ready():
        assert proc.poll() is None, (tmp_path / "apiserver.log").read_text()[-3000:]
        try:
            return api.get_code(_request_timeout=2)
        except Exception:
            return None

    try:
        t0 = time.monotonic()
        wait_until("the second API server to answer", ready, 120)
        bare = config.new_client_from_config(config_file=str(path))
        wait_until("its default namespace", lambda: client.CoreV1Api(bare).read_namespace("default", _request_timeout=5), 120)
        c.figures["rl_submit_bare_apiserver_start_s"] = round(time.monotonic() - t0, 1)
        # A real cluster, only without KubeRay: core and apiextensions served, no CRD, no ray.io group.
        assert client.ApiextensionsV1Api(bare).list_custom_resource_definition().items == []
        assert "ray.io" not in {g.name for g in client.ApisApi(bare).get_api_versions().groups}
        yield str(path)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        b64 = lambda k: base64.b64encode(k.encode()).decode()  # noqa: E731  (etcd's JSON gateway takes base64 keys)
        requests.post(f"http://127.0.0.1:{s['etcd']}/v3/kv/deleterange",
                      json={"key": b64(prefix + "/"), "range_end": b64(prefix + "0")}, timeout=10).raise_for_status()


def test_kuberay_not_installed_is_named(c: Cluster, api_server_without_kuberay):
    for args in (["--name", "sub-nocrd"], ["status", PREFIX + "nocrd"], ["stop", PREFIX + "nocrd"]):
        one_line_error(rl_submit(c, *args, kubeconfig=api_server_without_kuberay), 3,
                       "KubeRay is not installed on https://127.0.0.1:", "the API server serves no ray.io/v1")
