"""Level B: the policy API outlives its head. GCS fault tolerance (chart values gcsFaultTolerance, on for a RayService)
keeps the cluster state in the release's Redis (k8s/values/kind.yaml runs it; k8s/values/serve.yaml points the
RayService at it), so a deleted head pod comes back with the same Serve application while the replica and proxy on the
worker pod keep answering through the RayService's Kubernetes Service.

Under steady, bounded load (a few Pong act requests a second from this host to the Service's ClusterIP):
- the head pod deleted: <= 1% of the requests of the outage window fail, none after recovery, the same replica (same
  id, uptime continuing) answers before and after, the worker pod is untouched; time to recovery measured;
- the head deleted, then its replacement deleted while it starts: the same;
- the Redis pod deleted: it comes back with its data (its append-only file on the claim), the head recovers, serving
  never stops;
- the same head deletion on a RayService rendered with `gcsFaultTolerance.rayService=false`: the API goes down and
  comes back with a new replica (Serve redeployed): the difference is the feature, not the environment;
- Redis unreachable or refusing the password at start: the head waits in its `wait-redis` init container, with the
  reason in its log / termination message, instead of a Ray crash loop.

Figures: k8s_session.figures (bench/results/cluster_tier.json) and bench/results/gcs_ft.json.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest
import requests
import yaml

from kubekit import NAMESPACE, ROOT, Cluster, dump, first_doc, fresh_start, helm_path, sh, wait_until

FRAME = {"b64": base64.b64encode(bytes(210 * 160 * 3)).decode(), "dtype": "uint8", "shape": [210, 160, 3]}
RESULTS = ROOT / "bench" / "results" / "gcs_ft.json"
MAX_FAILED_RATIO = 0.01
REDIS_SELECTOR = "app.kubernetes.io/instance=rl-platform,app.kubernetes.io/component=redis"
REDIS_ADDRESS = "rl-platform-redis.rl-platform.svc:6379"  # the release's (k8s/values/kind.yaml, serve.yaml)
RECOVERY_TIMEOUT = 300
# Judged after recovery: long enough for a worker whose raylet lost the cluster with the head to show it (without
# fault tolerance the new head's GCS does not know the worker: its raylet exits within seconds, taking the replica).
AFTER_S = 30


@pytest.fixture(scope="module")
def real(cluster_b: Cluster) -> Cluster:
    if cluster_b.kind != "local":
        pytest.skip("kind: the host reaches no ClusterIP there; the local tier covers GCS fault tolerance")
    return cluster_b


@pytest.fixture(scope="module")
def gcs_results():
    """What this module measured, written to bench/results/gcs_ft.json at its end (merged with an earlier file, so a
    test run alone keeps the other figures)."""
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    fresh: dict = {}
    yield fresh
    if fresh:
        out.update(fresh)
        out["_about"] = ("tests/k8s/test_2e_gcs_ft.py on the local cluster tier, level B (2 cores, one real node): "
                         "Pong act requests through the RayService's Service while pods are deleted. outage_s: "
                         "deletion to the head Ready again; failed/requests: inside that window; after_*: the "
                         "30 s after "
                         "(10 s for the Redis deletion).")
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")


# -- load ----------------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    start: float
    end: float
    ok: bool
    error: str = ""
    replica: str = ""


@dataclass
class Load:
    """`clients` threads posting Pong act requests to `url`, each pausing `pause` s between requests (bounded: a few
    requests a second on 2 cores). Every outcome is kept with its time."""

    url: str
    clients: int = 2
    pause: float = 0.1
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        s = requests.Session()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                r = s.post(f"{self.url}/v1/policies/default/act", timeout=10,
                           json={"session_id": f"ft-{uuid.uuid4().hex[:8]}", "reset": True, "frame": FRAME})
                o = Outcome(t0, time.monotonic(), r.status_code == 200,
                            "" if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:160]}")
            except requests.RequestException as e:
                o = Outcome(t0, time.monotonic(), False, f"{type(e).__name__}: {str(e)[:160]}")
                s = requests.Session()  # a reset connection: start afresh, as a client library would
            with self._lock:
                self.outcomes.append(o)
            self._stop.wait(self.pause)

    def between(self, t0: float, t1: float) -> list[Outcome]:
        with self._lock:
            return sorted((o for o in self.outcomes if t0 <= o.start < t1), key=lambda o: o.start)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def _window(load: Load, t0: float, t1: float) -> dict:
    got = load.between(t0, t1)
    failed = [o for o in got if not o.ok]
    return {"requests": len(got), "failed": len(failed), "errors": sorted({o.error for o in failed})[:5]}


# -- the Serve application ------------------------------------------------------------------------------------------
def _service_url(real: Cluster, name: str) -> str:
    return f"http://{real.core.read_namespaced_service(f'{name}-serve-svc', NAMESPACE).spec.cluster_ip}:8000"


def _serving(real: Cluster, name: str, timeout: float = 900) -> str:
    """The serve Service's URL once the RayService answers an act request there."""
    def probe():
        url = _service_url(real, name)  # 404 until KubeRay makes the Service
        try:
            r = requests.post(f"{url}/v1/policies/default/act", timeout=10,
                              json={"session_id": "probe", "reset": True, "frame": FRAME})
        except requests.ConnectionError:
            return None
        return url if r.status_code == 200 else None

    return wait_until(f"RayService {name} to answer on {name}-serve-svc", probe, timeout, interval=3,
                      on_timeout=lambda: dump(real.ray("rayservices", name).get("status", {})))


def _replicas(url: str, n: int = 12) -> tuple[set[str], float]:
    """The replica ids that answer `n` stats requests (round robin over every replica) and the smallest uptime."""
    ids, uptime = set(), float("inf")
    try:
        for _ in range(n):
            ids.add(requests.get(f"{url}/v1/policies/default/stats", timeout=10).json()["replica"])
            uptime = min(uptime, requests.get(f"{url}/healthz", timeout=10).json()["uptime_s"])
    except (requests.RequestException, ValueError, KeyError) as e:
        raise AssertionError(f"the policy API at {url} does not answer its stats/healthz: {e}") from e
    return ids, uptime


def _cluster_of(real: Cluster, name: str) -> str:
    return real.ray("rayservices", name)["status"]["activeServiceStatus"]["rayClusterName"]


def _live(pods: list) -> list:
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _head(real: Cluster, cluster: str):
    heads = _live(real.pods(f"ray.io/cluster={cluster},ray.io/node-type=head"))
    return heads[0] if len(heads) == 1 else None


def _ready(pod) -> bool:
    return (pod is not None and pod.status.phase == "Running"
            and all(cs.ready for cs in pod.status.container_statuses or []))


def _workers(real: Cluster, cluster: str) -> dict[str, tuple[str, int]]:
    """uid -> (name, restarts of the ray-worker container) of every worker pod."""
    return {p.metadata.uid: (p.metadata.name, sum(cs.restart_count for cs in p.status.container_statuses or []))
            for p in _live(real.pods(f"ray.io/cluster={cluster},ray.io/node-type=worker"))}


def _wait_new_head_ready(real: Cluster, cluster: str, old_uids: set[str], what: str) -> object:
    def probe():
        h = _head(real, cluster)
        return h if h is not None and h.metadata.uid not in old_uids and _ready(h) else None

    return wait_until(what, probe, RECOVERY_TIMEOUT, interval=0.5,
                      on_timeout=lambda: dump([(p.metadata.name, p.status.phase, p.metadata.deletion_timestamp)
                                               for p in real.pods(f"ray.io/cluster={cluster}")]))


@pytest.fixture(scope="module")
def served(real: Cluster, pong_checkpoint: dict) -> dict:
    """k8s/serve/rayservice.yaml (GCS fault tolerance on) answering with the session's Pong checkpoint. A RayService
    already running exactly this manifest and serving that checkpoint (test_2c leaves it so) is reused: the head
    deletions need a serving application, not a fresh one."""
    doc = first_doc("k8s/serve/rayservice.yaml")
    name = doc["metadata"]["name"]
    reuse = False
    try:
        live = real.ray("rayservices", name)
        url = _service_url(real, name)
        info = requests.get(f"{url}/v1/policies/default", timeout=10).json()
        reuse = (live["spec"]["serveConfigV2"] == doc["spec"]["serveConfigV2"]
                 and live["spec"]["rayClusterConfig"].get("gcsFaultToleranceOptions")
                 == doc["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
                 and info.get("checkpoint_id") == pong_checkpoint["checkpoint_id"])
    except Exception:  # noqa: BLE001 - absent, not answering, another spec: start anew
        reuse = False
    if not reuse:
        fresh_start(real, "rayservices", name)
        t0 = time.monotonic()
        real.apply("k8s/serve/rayservice.yaml")
        url = _serving(real, name)
        real.figures["level_b_gcs_ft_rayservice_apply_to_first_answer_s"] = round(time.monotonic() - t0, 1)
    real.figures["level_b_gcs_ft_rayservice_reused"] = reuse
    return {"name": name, "url": url, "cluster": _cluster_of(real, name)}


def _head_loss(real: Cluster, served: dict, twice: bool) -> dict:
    """Delete the head under load (and, with `twice`, its replacement as soon as it exists); judge and measure."""
    url, cluster = served["url"], served["cluster"]
    ids_before, uptime_before = _replicas(url)
    t_ids = time.monotonic()
    workers_before = _workers(real, cluster)
    assert workers_before, f"no worker pod in {cluster}"
    head = _head(real, cluster)
    assert _ready(head), dump(head.status.to_dict())
    # The replica lives on a worker (the head has no Ray CPUs), so losing the head loses no replica.
    assert not _live(real.pods(f"ray.io/cluster={cluster},ray.io/node-type=head,ray.io/serve=true")), (
        "the head is in the serve Service (excludeHeadPodFromServeSvc)")
    load = Load(url)
    try:
        wait_until("5 requests answered before the deletion",
                   lambda: sum(o.ok for o in load.between(0, float("inf"))) >= 5 or None, 60)
        t_delete = time.monotonic()
        real.kubectl("-n", NAMESPACE, "delete", "pod", head.metadata.name, "--wait=false")
        gone = {head.metadata.uid}
        if twice:
            second = wait_until("the replacement head pod", lambda: (lambda h: h if h is not None and h.metadata.uid
                                                                      not in gone else None)(_head(real, cluster)),
                                RECOVERY_TIMEOUT, interval=0.3)
            real.kubectl("-n", NAMESPACE, "delete", "pod", second.metadata.name, "--wait=false")
            gone.add(second.metadata.uid)
        new_head = _wait_new_head_ready(real, cluster, gone, f"a new head of {cluster} Ready")
        t_recovered = time.monotonic()
        time.sleep(AFTER_S)  # the after-recovery window: steady load, judged below (not a readiness wait)
        t_end = time.monotonic()
    finally:
        load.stop()
    during, after = _window(load, t_delete, t_recovered), _window(load, t_recovered, t_end)
    fig = {"outage_s": round(t_recovered - t_delete, 1), "requests": during["requests"], "failed": during["failed"],
           "after_requests": after["requests"], "after_failed": after["failed"], "errors": during["errors"]}
    assert during["requests"] >= 20, (during, "too little load to judge")
    assert during["failed"] <= MAX_FAILED_RATIO * during["requests"], (
        f"{during['failed']} of {during['requests']} requests failed while the head was away "
        f"(> {MAX_FAILED_RATIO:.0%}): the Serve proxy/replica on the worker stopped answering. {fig}")
    assert after["requests"] >= 5 and after["failed"] == 0, (
        f"{after['failed']} of {after['requests']} requests failed in the {AFTER_S} s after the new head was Ready",
        fig)
    assert _workers(real, cluster) == workers_before, (
        "a worker pod was replaced or its Ray restarted: its raylet lost the cluster with the head (is the RayService "
        "rendered with gcsFaultToleranceOptions?)", workers_before, _workers(real, cluster))
    # The same application: the same replica (id and count) kept running, not redeployed by the new head.
    ids_after, uptime_after = _replicas(url)
    assert ids_after == ids_before and len(ids_after) == 1, ("Serve was redeployed: other replicas answer",
                                                             ids_before, ids_after)
    assert uptime_after >= uptime_before + (time.monotonic() - t_ids) - 15, (
        "the replica restarted", uptime_before, uptime_after)
    # KubeRay wired the chart's gcsFaultToleranceOptions: the new head knows it (annotation) and waited for Redis.
    assert new_head.metadata.annotations.get("ray.io/ft-enabled") == "true", new_head.metadata.annotations
    assert [c.name for c in new_head.spec.init_containers or []] == ["wait-redis"], new_head.spec.init_containers
    assert _cluster_of(real, served["name"]) == cluster, "KubeRay replaced the RayCluster"
    return fig


def test_head_pod_deleted_under_load_the_api_keeps_answering(real: Cluster, served: dict, gcs_results: dict):
    fig = _head_loss(real, served, twice=False)
    real.figures["level_b_gcs_ft_head_loss_outage_s"] = fig["outage_s"]
    real.figures["level_b_gcs_ft_head_loss_failed"] = f"{fig['failed']}/{fig['requests']}"
    gcs_results["ft_on_head_deleted"] = fig
    print(f"\nhead deleted with GCS FT: {fig}")


def test_head_deleted_twice_in_a_row_the_api_keeps_answering(real: Cluster, served: dict, gcs_results: dict):
    """The replacement head is deleted too while it starts (a drain that evicts it again)."""
    fig = _head_loss(real, served, twice=True)
    real.figures["level_b_gcs_ft_head_twice_outage_s"] = fig["outage_s"]
    gcs_results["ft_on_head_deleted_twice"] = fig
    print(f"\nhead deleted twice with GCS FT: {fig}")


def _redis_cli(real: Cluster, pod: str, *args: str) -> str:
    # The password stays in the pod's environment (REDISCLI_AUTH), off this command line.
    cmd = 'REDISCLI_AUTH="$REDIS_PASSWORD" redis-cli -p "$REDIS_PORT" "$@"'
    return real.kubectl("-n", NAMESPACE, "exec", pod, "-c", "redis", "--", "sh", "-c", cmd, "redis-cli", *args,
                        timeout=60).stdout.strip()


def test_redis_pod_deleted_it_returns_with_its_data_and_serving_never_stops(real: Cluster, served: dict,
                                                                             gcs_results: dict):
    url, cluster = served["url"], served["cluster"]
    (redis,) = _live(real.pods(REDIS_SELECTOR))
    marker = uuid.uuid4().hex
    assert _redis_cli(real, redis.metadata.name, "SET", "rl-platform-test-marker", marker) == "OK"
    keys_before = int(_redis_cli(real, redis.metadata.name, "DBSIZE"))
    assert keys_before >= 2, "Ray's GCS wrote nothing to Redis"
    ids_before, _ = _replicas(url)
    head_before = _head(real, cluster)
    load = Load(url)
    try:
        wait_until("5 requests answered before the deletion",
                   lambda: sum(o.ok for o in load.between(0, float("inf"))) >= 5 or None, 60)
        t_delete = time.monotonic()
        real.kubectl("-n", NAMESPACE, "delete", "pod", redis.metadata.name, "--wait=false")
        new_redis = wait_until("a new Redis pod Ready", lambda: next(
            (p for p in _live(real.pods(REDIS_SELECTOR)) if p.metadata.uid != redis.metadata.uid and _ready(p)), None),
            RECOVERY_TIMEOUT, interval=0.5)
        t_redis = time.monotonic()
        # The cluster recovers: Ray's GCS exits when it loses Redis, so the head's Ray container restarts (once
        # Redis is back, wait-redis lets it through) and reloads the state; the head is Ready again after that
        # restart, or, had the GCS not noticed, still Ready 20 s after Redis returned.
        restarts_before = sum(cs.restart_count for cs in head_before.status.container_statuses)

        def head_recovered():
            h = _head(real, cluster)
            if not _ready(h):
                return None
            restarted = sum(cs.restart_count for cs in h.status.container_statuses) > restarts_before
            replaced = h.metadata.uid != head_before.metadata.uid
            return h if restarted or replaced or time.monotonic() - t_redis >= 20 else None

        wait_until("the head Ready after Redis came back", head_recovered, RECOVERY_TIMEOUT, interval=0.5)
        t_recovered = time.monotonic()
        time.sleep(10)  # the after-recovery window (load keeps running; judged below; no head was lost here)
        t_end = time.monotonic()
    finally:
        load.stop()
    whole, after = _window(load, t_delete, t_recovered), _window(load, t_recovered, t_end)
    head_after = _head(real, cluster)
    gcs_restarts = (sum(cs.restart_count for cs in head_after.status.container_statuses)
                    - sum(cs.restart_count for cs in head_before.status.container_statuses))
    fig = {"redis_back_s": round(t_redis - t_delete, 1), "outage_s": round(t_recovered - t_delete, 1),
           "requests": whole["requests"], "failed": whole["failed"], "after_requests": after["requests"],
           "after_failed": after["failed"], "head_container_restarts": gcs_restarts,
           "head_replaced": head_after.metadata.uid != head_before.metadata.uid, "errors": whole["errors"]}
    print(f"\nRedis pod deleted: {fig}")
    gcs_results["ft_on_redis_deleted"] = fig
    real.figures["level_b_gcs_ft_redis_back_s"] = fig["redis_back_s"]
    # Its data came back from the append-only file on the claim: our marker and Ray's tables.
    assert _redis_cli(real, new_redis.metadata.name, "GET", "rl-platform-test-marker") == marker
    assert int(_redis_cli(real, new_redis.metadata.name, "DBSIZE")) >= keys_before - 1
    assert whole["failed"] <= MAX_FAILED_RATIO * max(whole["requests"], 1), (
        "serving stopped while Redis was away", fig)
    assert after["requests"] >= 5 and after["failed"] == 0, ("requests failed after recovery", after)
    assert _replicas(url)[0] == ids_before, "the Serve application was redeployed"
    _redis_cli(real, new_redis.metadata.name, "DEL", "rl-platform-test-marker")


def _render_serve(name: str, *sets: str) -> str:
    return sh(helm_path(), "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
              "-f", str(ROOT / "k8s" / "values" / "serve.yaml"), "--set", f"rayService.name={name}", *sets,
              "--show-only", "templates/rayservice.yaml").stdout


def test_without_gcs_fault_tolerance_the_same_head_deletion_takes_the_api_down(real: Cluster, pong_checkpoint: dict,
                                                                               gcs_results: dict):
    """The contrast: the same RayService with `gcsFaultTolerance.rayService=false` loses its Serve application with
    its head; the API fails until the new head has redeployed it (a new replica)."""
    manifest = _render_serve("policy-noft", "--set", "gcsFaultTolerance.rayService=false")
    doc = yaml.safe_load(manifest)
    name = doc["metadata"]["name"]
    assert "gcsFaultToleranceOptions" not in doc["spec"]["rayClusterConfig"], doc["spec"]["rayClusterConfig"]
    fresh_start(real, "rayservices", name)
    real.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=manifest)
    try:
        url = _serving(real, name)
        cluster = _cluster_of(real, name)
        ids_before, _ = _replicas(url)
        head = _head(real, cluster)
        assert head.metadata.annotations.get("ray.io/ft-enabled") == "false", head.metadata.annotations
        load = Load(url)
        try:
            wait_until("5 requests answered before the deletion",
                       lambda: sum(o.ok for o in load.between(0, float("inf"))) >= 5 or None, 60)
            t_delete = time.monotonic()
            real.kubectl("-n", NAMESPACE, "delete", "pod", head.metadata.name, "--wait=false")
            # The API goes down: the new head's GCS starts an empty cluster that does not know the worker, whose
            # raylet then exits, taking the replica and proxy with it. It comes back once the worker has rejoined
            # and the new head has redeployed Serve: settled when 15 s of requests after the last failure succeeded.
            wait_until("a failed request after deleting the head without GCS fault tolerance", lambda: any(
                not o.ok for o in load.between(t_delete, float("inf"))) or None, RECOVERY_TIMEOUT, interval=1,
                on_timeout=lambda: str(_window(load, t_delete, float("inf"))))

            def settled():
                got = load.between(t_delete, float("inf"))
                fails = [o for o in got if not o.ok]
                if not fails:
                    return None
                later = [o for o in got if o.start > fails[-1].start]
                if len(later) < 10 or later[-1].start - fails[-1].start < 15:
                    return None
                return fails[0], later[0]

            first_fail, back = wait_until("the API to answer again for 15 s", settled, 2 * RECOVERY_TIMEOUT, interval=1,
                                          on_timeout=lambda: str(_window(load, t_delete, float("inf"))))
            t_back = time.monotonic()
        finally:
            load.stop()
        during = _window(load, t_delete, back.start)
        outage = back.start - first_fail.start
        ids_after, _ = _replicas(url)
        fig = {"requests": during["requests"], "failed": during["failed"], "api_down_s": round(outage, 1),
               "delete_to_back_s": round(t_back - t_delete, 1), "errors": during["errors"],
               "replica_replaced": ids_after != ids_before}
        print(f"\nhead deleted without GCS FT: {fig}")
        gcs_results["ft_off_head_deleted"] = fig
        real.figures["level_b_gcs_ft_off_api_down_s"] = fig["api_down_s"]
        real.figures["level_b_gcs_ft_off_failed"] = f"{during['failed']}/{during['requests']}"
        # Down for real (well past the 1% the fault-tolerant RayService stays under), and redeployed from scratch.
        assert during["failed"] > MAX_FAILED_RATIO * during["requests"] and outage >= 5, fig
        assert ids_after != ids_before, ("the same replica survived the head without GCS fault tolerance", fig)
    finally:
        real.delete_ray("rayservices", name, wait_pods=False)


def _bad_redis_cluster(name: str, *sets: str) -> str:
    """A head-only RayCluster of the release's values with GCS fault tolerance pointed at a Redis it cannot use."""
    return sh(helm_path(), "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "--namespace", NAMESPACE,
              "-f", str(ROOT / "k8s" / "values" / "kind.yaml"), "-f", str(ROOT / "k8s" / "values" / "local.yaml"),
              "--set", f"fullnameOverride={name}", "--set", "storage.enabled=false",
              "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=rl-platform",
              "--set", "gcsFaultTolerance.rayCluster=true", "--set", "gcsFaultTolerance.redis.enabled=false",
              "--set", "gcsFaultTolerance.waitForRedisSeconds=40", *sets,
              "--show-only", "templates/raycluster.yaml").stdout


def test_redis_unreachable_or_refusing_the_password_holds_the_head_with_the_reason(real: Cluster):
    wrong = "gcsft-wrong-password"
    real.kubectl("-n", NAMESPACE, "delete", "secret", wrong, "--ignore-not-found")
    real.kubectl("-n", NAMESPACE, "create", "secret", "generic", wrong, "--from-literal=password=not-the-password")
    absent = "rl-platform-redis-absent.rl-platform.svc:6379"
    cases = {
        "gcsft-unreachable": _bad_redis_cluster("gcsft-unreachable",
                                                "--set", f"gcsFaultTolerance.redisAddress={absent}",
                                                "--set", "gcsFaultTolerance.passwordSecret.name=rl-platform-redis"),
        "gcsft-wrongpass": _bad_redis_cluster("gcsft-wrongpass",  # the release's Redis, the wrong password
                                              "--set", f"gcsFaultTolerance.redisAddress={REDIS_ADDRESS}",
                                              "--set", f"gcsFaultTolerance.passwordSecret.name={wrong}"),
    }
    for name in cases:
        real.delete_ray("rayclusters", name, timeout=240)
    try:
        for manifest in cases.values():
            real.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=manifest)

        def init_state(name: str):
            head = _head(real, name)
            if head is None:
                return None
            st = next(iter(head.status.init_container_statuses or []), None)
            logs = real.kubectl("-n", NAMESPACE, "logs", head.metadata.name, "-c", "wait-redis", check=False).stdout
            return head, st, logs

        # Unreachable: the head waits in Init, saying what it waits for; Ray's container never starts.
        head, st, logs = wait_until("the unreachable-Redis head to log why it waits", lambda: (
            lambda r: r if r and f"waiting for Redis at {absent}" in r[2] else None)(
            init_state("gcsft-unreachable")), 120, interval=2)
        ray_running = [cs.name for cs in head.status.container_statuses or [] if cs.state.running]
        assert head.status.phase == "Pending" and not ray_running, dump(head.status.to_dict())
        # Wrong password: the init container ends at once with Redis's answer as its termination message.
        def refused():
            r = init_state("gcsft-wrongpass")
            if not r or not r[1]:
                return None
            term = r[1].state.terminated or r[1].last_state.terminated
            return term if term and "refused the password" in (term.message or "") else None

        term = wait_until("the wrong-password head's wait-redis to end with the reason", refused, 120, interval=2)
        assert term.exit_code != 0 and "WRONGPASS" in term.message, term
        assert wrong in term.message, term.message
    finally:
        for name in cases:
            real.delete_ray("rayclusters", name, wait_pods=False)
            # KubeRay's Redis clean-up (a Job built from this head, wait-redis included) cannot reach or log in to
            # that Redis either: drop its finalizer, as KubeRay's docs say to for a Redis that is gone.
            real.kubectl("-n", NAMESPACE, "patch", "raycluster", name, "--type=merge", "-p",
                         '{"metadata":{"finalizers":null}}', check=False)
        real.kubectl("-n", NAMESPACE, "delete", "secret", wrong, "--ignore-not-found")
