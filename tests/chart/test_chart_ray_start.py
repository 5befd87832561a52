"""What the Ray nodes of every rendering advertise once KubeRay 1.6 has turned rayStartParams into `ray start`:
the pool resources parse for KubeRay, the shell and Ray's autoscaler alike, GPU groups get their GPUs, and memory adds
up (object store >= Ray's minimum, /dev/shm with headroom, Ray's `memory` next to /dev/shm within the limit)."""

import json

import pytest
import yaml

from chartkit import CI_VALUES, K8S_VALUES, ROOT, k8s_values_stack
from rl_submit.shape import cluster_specs, quantity, ray_groups, ray_node_resources

pytestmark = pytest.mark.chart

GENERATED = sorted([*(ROOT / "k8s" / "jobs").glob("*.yaml"), *(ROOT / "k8s" / "serve").glob("*.yaml")])
ALL_ON = {"rayJob.enabled": True, "rayService.enabled": True, "workerGroups.learner-gpu.enabled": True}
CASES = ([("defaults", [], {}), ("everything-on", [], ALL_ON)]
         + [(f"ci/{p.name}", [p], {}) for p in CI_VALUES]
         + [(f"k8s/values/{p.name}", k8s_values_stack(p), {}) for p in sorted(K8S_VALUES.glob("*.yaml"))])


def _groups(docs):
    return [(f"{where}[{name}]", params, pod, replicas)
            for d in docs for where, cs in cluster_specs(d) for name, params, pod, replicas in ray_groups(cs)]


def _docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _check_pool_resources(groups):
    assert groups
    for where, params, pod, _ in groups:
        container = pod["containers"][0]
        res, errors = ray_node_resources(params, container)
        assert errors == [], f"{where}: KubeRay would log {errors} for resources={params.get('resources')!r}"
        if "resources" in params:
            # Ray's autoscaler (autoscaling_config._get_custom_resources): drop the first and last character and
            # every backslash, then JSON.
            autoscaler = json.loads(params["resources"][1:-1].replace("\\", ""))
            assert autoscaler == {k: res[k] for k in autoscaler}, where
            assert set(autoscaler) <= {"rollout_pool", "learner_pool"}, where
        gpus = quantity(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        assert res["GPU"] == gpus, f"{where}: Ray advertises {res['GPU']} GPUs, the container has {gpus}"


@pytest.mark.parametrize("name, values, sets", CASES, ids=[c[0] for c in CASES])
def test_pool_resources_parse_for_kuberay_the_shell_and_the_autoscaler(tools, name, values, sets):
    _check_pool_resources(_groups(tools.render(*values, sets=sets)))


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_generated_manifests_advertise_pools_and_gpus(path):
    _check_pool_resources(_groups(_docs(path)))


def test_the_kuberay_parse_bites():
    """The escaped form the chart used to render makes KubeRay skip --num-gpus."""
    params = {"num-cpus": "4", "resources": '"{\\"learner_pool\\": 1}"'}
    container = {"resources": {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}}}
    res, errors = ray_node_resources(params, container)
    assert errors and res["GPU"] == 0 and res["learner_pool"] == 1
    res, errors = ray_node_resources({**params, "resources": '\'{"learner_pool": 1}\''}, container)
    assert errors == [] and res["GPU"] == 1 and res["learner_pool"] == 1


MiB = 2**20


def _check_memory(groups):
    assert groups
    for where, params, pod, _ in groups:
        container = pod["containers"][0]
        res, _ = ray_node_resources(params, container)
        store = res["object_store_memory"]
        assert store >= 75 * MiB, f"{where}: object store {store / MiB} MiB, Ray needs at least 75 MiB"
        (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"]["medium"] == "Memory"
        shm_bytes = quantity(shm["emptyDir"]["sizeLimit"])
        assert shm_bytes >= 1.1 * store, f"{where}: /dev/shm {shm_bytes / MiB} MiB for a {store / MiB} MiB store"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"], where
        limit = container.get("resources", {}).get("limits", {}).get("memory")
        if limit:
            # The emptyDir's pages count against the limit: Ray's memory resource must leave room for them.
            assert res["memory"] + shm_bytes <= quantity(limit), \
                f"{where}: Ray memory {res['memory'] / MiB} MiB + /dev/shm {shm_bytes / MiB} MiB > limit {limit}"
            assert res["memory"] >= 100 * MiB, where


@pytest.mark.parametrize("name, values, sets", CASES, ids=[c[0] for c in CASES])
def test_memory_adds_up_on_every_ray_node(tools, name, values, sets):
    _check_memory(_groups(tools.render(*values, sets=sets)))


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_generated_manifests_memory_adds_up(path):
    _check_memory(_groups(_docs(path)))


def test_a_worker_group_without_object_store_gets_rays_default(tools):
    group = {"pool": "none", "replicas": 1, "minReplicas": 0, "maxReplicas": 1, "cpus": 1, "memory": "1Gi", "gpus": 0}
    docs = tools.render(sets={"workerGroups.eval-cpu": group})
    ((_, params, pod, _),) = [g for g in _groups(docs) if g[0].endswith("[eval-cpu]")]
    assert int(params["object-store-memory"]) == 307 * MiB  # 30% of 1024 MiB
    _check_memory([("eval-cpu", params, pod, 1)])
