"""Every training job of k8s/values fits the Ray cluster it runs on, as Ray would place it.

The request comes from the trainer itself: the job's entrypoint overrides are composed with Hydra, and rl_submit.shape
places the trainer's request for that config (trainer.capacity.request, RLlib's request read from the config: driver,
env runners, learners; a plain run drops the driver's) on the nodes the rendered RayCluster may have, with the same code rl-submit uses to refuse a job that never fits.
"""

from __future__ import annotations

import pytest
import yaml

from chartkit import K8S_VALUES, ROOT
from rl_submit.shape import cluster_specs, groups, misfit, nodes, place
from trainer.capacity import request

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


def _groups(cluster):
    out = groups(cluster)
    assert all(g.errors == [] for g in out), [(g.name, g.errors) for g in out]
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


@pytest.mark.parametrize("values, tune", CASES, ids=[f"{p.name}-tune={t}" for p, t in CASES])
def test_training_job_fits_its_ray_cluster(tools, values, tune):
    job, cluster = _job_and_cluster(tools, values)
    cfg = _job_cfg(job["spec"]["entrypoint"], tune)
    assert cfg.resources.rollout_resource == "rollout_pool" and cfg.resources.learner_resource == "learner_pool"
    req = request(cfg)
    bundles = [b for _, b in req]
    assert any("rollout_pool" in b for b in bundles) and any("learner_pool" in b for b in bundles), bundles
    assert (req[0][0] == "the Tune trial driver") == (tune != "none"), req
    assert misfit(req, _groups(cluster)) is None


@pytest.mark.parametrize("values", JOB_VALUES, ids=[p.name for p in JOB_VALUES])
def test_learner_group_gpus_are_num_learners_times_gpus_per_learner(tools, values):
    """Data-parallel learners: the learner pool holds exactly the GPUs the job's learners take, no idle GPU pod."""
    job, cluster = _job_and_cluster(tools, values)
    res = _job_cfg(job["spec"]["entrypoint"]).resources
    learner_nodes = [r for _, r in nodes(_groups(cluster)) if r.get("learner_pool")]
    gpus = sum(r.get("GPU", 0) for r in learner_nodes)
    assert gpus == max(res.num_learners, 1) * res.num_gpus_per_learner, (values.name, learner_nodes)
    if res.num_gpus_per_learner:
        # One learner per GPU: every learner_pool unit is a GPU (learner_pool counts GPUs on GPU nodes).
        assert sum(r["learner_pool"] for r in learner_nodes) == gpus


def test_ddp_job_spreads_its_learners_over_gpu_pods(tools):
    job, cluster = _job_and_cluster(tools, K8S_VALUES / "pong-ddp.yaml")
    res = _job_cfg(job["spec"]["entrypoint"]).resources
    assert res.num_learners == 2 and res.num_gpus_per_learner == 1
    learner_nodes = [n for n, r in nodes(_groups(cluster)) if r.get("learner_pool")]
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
    free = [("head#0", {"CPU": 0.0}), ("rollout#0", {"CPU": 2.0, "rollout_pool": 2.0}),
            ("learner#0", {"CPU": 1.0, "learner_pool": 1.0})]
    assert place([env_runner, env_runner, learner], free) == []
    assert place([{"CPU": 1.0}, env_runner, env_runner, learner], free) == [{"CPU": 1.0}]
    assert place([{"CPU": 1.0, "GPU": 1.0, "learner_pool": 1.0}], free) == [{"CPU": 1.0, "GPU": 1.0,
                                                                              "learner_pool": 1.0}]
