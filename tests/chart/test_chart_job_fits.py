"""Every training job of k8s/values fits the Ray cluster it runs on, as Ray would place it.

The request comes from the trainer itself: the job's entrypoint overrides are composed with Hydra and turned into the
RLlib config by trainer.algo.build_algo_config; RLlib's own resource request (Algorithm.default_resource_request)
lists one bundle per env runner ({CPU, rollout_pool}), one per learner ({CPU, GPU, learner_pool}) and, first, the
trial driver's ({CPU}: RLlib's main process). A plain run (tune=none) is driven by the job's entrypoint process on the
head, outside Ray's accounting, so it drops that first bundle; a Tune run (tune=asha, ...) needs it for every trial.
The supply is what each node of the rendered cluster advertises once KubeRay has started Ray on it (chartkit).
"""

from __future__ import annotations

import pytest
import yaml

from chartkit import K8S_VALUES, ROOT, cluster_specs, ray_groups, ray_node_resources

pytestmark = pytest.mark.chart

CONF = ROOT / "hydra_conf"
JOB_VALUES = [p for p in sorted(K8S_VALUES.glob("*.yaml")) if "rayJob" in (yaml.safe_load(p.read_text()) or {})]
CASES = [(p, tune) for p in JOB_VALUES for tune in ("none", "asha")]


def _job_and_cluster(tools, values):
    docs = tools.render(values, sets={"rayJob.enabled": True})
    (job,) = [d for d in docs if d["kind"] == "RayJob"]
    if "clusterSelector" in job["spec"]:
        name = job["spec"]["clusterSelector"]["ray.io/cluster"]
        (cluster,) = [d["spec"] for d in docs if d["kind"] == "RayCluster" and d["metadata"]["name"] == name]
    else:
        ((_, cluster),) = cluster_specs(job)
    return job, cluster


def _nodes(cluster):
    """One dict of Ray resources per node the cluster starts with (autoscaling: as many as it may grow to)."""
    out = []
    for name, params, pod, replicas in ray_groups(cluster):
        if name != "head" and cluster.get("enableInTreeAutoscaling"):
            g = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == name)
            replicas = int(g["maxReplicas"])
        res, errors = ray_node_resources(params, pod["containers"][0])
        assert errors == [], f"{name}: {errors}"
        res = {k: v for k, v in res.items() if k not in ("memory", "object_store_memory")}
        out += [(f"{name}#{i}", dict(res)) for i in range(replicas)]
    return out


def _job_cfg(entrypoint: str, tune: str = "none"):
    """The trainer's composed config for a job's entrypoint."""
    from hydra import compose, initialize_config_dir

    from trainer.config import register_configs

    argv = entrypoint.split()
    assert argv[:3] == ["python", "-m", "trainer"], argv
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[*argv[3:], f"tune={tune}"])


def _bundles(entrypoint: str, tune: str) -> list[dict[str, float]]:
    from trainer.algo import build_algo_config

    cfg = _job_cfg(entrypoint, tune)
    assert cfg.resources.rollout_resource == "rollout_pool" and cfg.resources.learner_resource == "learner_pool"
    config = build_algo_config(cfg)
    bundles = [dict(b) for b in config.algo_class.default_resource_request(config).bundles]
    return bundles if tune != "none" else bundles[1:]


def _place(bundles, nodes):
    """First fit, biggest bundles first (RLlib's PACK strategy is best effort): the bundles that found no node."""
    free = [dict(res) for _, res in nodes]
    left = []
    for b in sorted(bundles, key=lambda b: (-len(b), -sum(b.values()))):
        for res in free:
            if all(res.get(k, 0) >= v for k, v in b.items()):
                for k, v in b.items():
                    res[k] -= v
                break
        else:
            left.append(b)
    return left


@pytest.mark.parametrize("values, tune", CASES, ids=[f"{p.name}-tune={t}" for p, t in CASES])
def test_training_job_fits_its_ray_cluster(tools, values, tune):
    job, cluster = _job_and_cluster(tools, values)
    bundles = _bundles(job["spec"]["entrypoint"], tune)
    assert any("rollout_pool" in b for b in bundles) and any("learner_pool" in b for b in bundles), bundles
    nodes = _nodes(cluster)
    left = _place(bundles, nodes)
    assert left == [], (f"{values.name} with tune={tune}: no room for {left} of {bundles} on "
                        f"{[(n, r) for n, r in nodes]}")


@pytest.mark.parametrize("values", JOB_VALUES, ids=[p.name for p in JOB_VALUES])
def test_learner_group_gpus_are_num_learners_times_gpus_per_learner(tools, values):
    """Data-parallel learners: the learner pool holds exactly the GPUs the job's learners take, no idle GPU pod."""
    job, cluster = _job_and_cluster(tools, values)
    res = _job_cfg(job["spec"]["entrypoint"]).resources
    learner_nodes = [r for _, r in _nodes(cluster) if r.get("learner_pool")]
    gpus = sum(r.get("GPU", 0) for r in learner_nodes)
    assert gpus == max(res.num_learners, 1) * res.num_gpus_per_learner, (values.name, learner_nodes)
    if res.num_gpus_per_learner:
        # One learner per GPU: every learner_pool unit is a GPU (learner_pool counts GPUs on GPU nodes).
        assert sum(r["learner_pool"] for r in learner_nodes) == gpus


def test_ddp_job_spreads_its_learners_over_gpu_pods(tools):
    job, cluster = _job_and_cluster(tools, K8S_VALUES / "pong-ddp.yaml")
    res = _job_cfg(job["spec"]["entrypoint"]).resources
    assert res.num_learners == 2 and res.num_gpus_per_learner == 1
    learner_nodes = [n for n, r in _nodes(cluster) if r.get("learner_pool")]
    assert learner_nodes == ["learner-gpu#0", "learner-gpu#1"]


def test_job_values_cover_the_own_and_the_existing_cluster():
    names = {p.name for p in JOB_VALUES}
    assert {"cartpole.yaml", "pong.yaml", "pong-ddp.yaml", "kind.yaml"} <= names
    kind = yaml.safe_load((K8S_VALUES / "kind.yaml").read_text())
    assert kind["rayJob"]["useExistingCluster"] is True


def test_the_fit_check_bites():
    """No spare CPU for a Tune trial's driver (the head advertising 0 CPUs) is caught."""
    env_runner = {"CPU": 1.0, "rollout_pool": 1.0}
    learner = {"CPU": 1.0, "learner_pool": 1.0}
    nodes = [("head#0", {"CPU": 0.0}), ("rollout#0", {"CPU": 2.0, "rollout_pool": 2.0}),
             ("learner#0", {"CPU": 1.0, "learner_pool": 1.0})]
    assert _place([env_runner, env_runner, learner], nodes) == []
    assert _place([{"CPU": 1.0}, env_runner, env_runner, learner], nodes) == [{"CPU": 1.0}]
    assert _place([{"CPU": 1.0, "GPU": 1.0, "learner_pool": 1.0}], nodes) == [{"CPU": 1.0, "GPU": 1.0,
                                                                               "learner_pool": 1.0}]
