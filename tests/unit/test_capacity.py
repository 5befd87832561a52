"""trainer.capacity: a request is compared with the nodes' resources before the algorithm is built; the request is
the one RLlib makes for the config trainer.algo builds (checked here against RLlib itself)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from trainer.capacity import check_capacity, request, shortfall
from trainer.config import register_configs
from trainer.errors import TrainerError

CONF = Path(__file__).resolve().parents[2] / "hydra_conf"


class Res(dict):
    __getattr__ = dict.__getitem__


def cfg(scheduler="none", eval_env_runners=0, **kw):
    r = Res(num_env_runners=0, num_cpus_per_env_runner=1.0, num_learners=0, num_cpus_per_learner=1.0,
            num_gpus_per_learner=0.0, rollout_resource=None, learner_resource=None, address=None,
            wait_for_resources_s=0.0)
    r.update(kw)
    return SimpleNamespace(resources=r, tune=SimpleNamespace(scheduler=scheduler),
                           evaluation=SimpleNamespace(interval=5, num_env_runners=eval_env_runners))


CPU2 = [{"CPU": 2.0, "memory": 1e9}]


def test_the_local_default_asks_ray_for_nothing():
    assert request(cfg()) == []
    assert shortfall([], CPU2) is None


def test_a_gpu_learner_on_a_cpu_only_ray_names_gpu():
    req = request(cfg(num_learners=1, num_gpus_per_learner=1.0))
    why = shortfall(req, CPU2)
    assert why and "GPU 1" in why and "learner" in why


def test_eval_env_runners_ask_for_the_rollout_pool_too():
    c = cfg(num_env_runners=1, rollout_resource="rollout_pool", eval_env_runners=1)
    assert request(c) == [("env runner 1", {"CPU": 1.0, "rollout_pool": 1.0}),
                          ("evaluation env runner 1", {"CPU": 1.0, "rollout_pool": 1.0})]
    # One rollout_pool unit fits the training env runner, not the eval one as well.
    with pytest.raises(TrainerError, match="rollout_pool 2"):
        check_capacity(c, print, nodes=lambda: [{"CPU": 4.0, "rollout_pool": 1.0}])


def test_a_missing_pool_resource_names_the_pool():
    req = request(cfg(num_env_runners=1, rollout_resource="rollout_pool"))
    assert "rollout_pool" in shortfall(req, CPU2)


def test_too_many_cpus_in_total_names_cpu():
    req = request(cfg(num_env_runners=3))
    why = shortfall(req, CPU2)
    assert "CPU 3" in why and "CPU 2" in why
    assert shortfall(req, CPU2 + [{"CPU": 1.0}]) is None


def test_each_bundle_must_fit_one_node():
    req = request(cfg(num_learners=1, num_cpus_per_learner=2.0))
    assert shortfall(req, [{"CPU": 1.0}, {"CPU": 1.0}]) is not None


def test_embedded_fails_at_once_with_one_line_and_a_hint():
    with pytest.raises(TrainerError, match=r"GPU 1.*num_gpus_per_learner=0"):
        check_capacity(cfg(num_learners=1, num_gpus_per_learner=1.0), print, nodes=lambda: CPU2)


def test_a_cluster_waits_for_nodes_then_fails_naming_the_resource():
    calls = []

    def nodes():
        calls.append(1)
        return CPU2

    c = cfg(num_env_runners=1, rollout_resource="rollout_pool", address="head:6379", wait_for_resources_s=0.5)
    with pytest.raises(TrainerError, match=r"rollout_pool.*0.5s"):
        check_capacity(c, print, nodes=nodes, ask=lambda b: None)
    assert len(calls) >= 2  # looked again before giving up


def test_a_cluster_that_grows_in_time_passes():
    seen = iter([CPU2] + [CPU2 + [{"CPU": 1.0, "rollout_pool": 1.0}]] * 100)
    c = cfg(num_env_runners=1, rollout_resource="rollout_pool", address="head:6379", wait_for_resources_s=30)
    asked = []
    check_capacity(c, print, nodes=lambda: next(seen), ask=asked.append)
    # The autoscaler was asked for the missing actors while the trainer waited (it scales only for pending demand,
    # and none is pending before the actors exist), then the request was withdrawn.
    assert asked == [[{"CPU": 1.0, "rollout_pool": 1.0}], []], asked


def test_a_failed_wait_withdraws_its_request_from_the_autoscaler():
    asked = []
    c = cfg(num_env_runners=1, rollout_resource="rollout_pool", address="head:6379", wait_for_resources_s=0.2)
    with pytest.raises(TrainerError, match="rollout_pool"):
        check_capacity(c, print, nodes=lambda: CPU2, ask=asked.append)
    assert asked == [[{"CPU": 1.0, "rollout_pool": 1.0}], []], asked


def test_a_request_that_fits_asks_the_autoscaler_for_nothing():
    asked = []
    c = cfg(num_env_runners=1, rollout_resource="rollout_pool", address="head:6379")
    check_capacity(c, print, nodes=lambda: [{"CPU": 2.0, "rollout_pool": 1.0}], ask=asked.append)
    assert asked == []


# Shapes whose request RLlib must agree with: env runners (+ pool), evaluation runners, learners with and without
# GPUs and pools, the learner inside the driver (num_learners=0, CPU or GPU), a Tune trial's driver, each algorithm.
RLLIB_CASES = [
    ("algo=ppo",),
    ("algo=ppo", "resources=cluster", "resources.num_env_runners=3", "resources.num_learners=2",
     "resources.num_cpus_per_learner=2", "evaluation.num_env_runners=2"),
    ("algo=ppo", "resources=cluster", "resources.num_learners=1", "resources.num_gpus_per_learner=1", "tune=asha"),
    ("algo=ppo", "resources=cluster", "resources.num_learners=0", "resources.num_cpus_per_learner=3", "tune=asha"),
    ("algo=ppo", "resources.num_env_runners=2", "resources.num_cpus_per_env_runner=0.5", "tune=asha"),
    ("~experiment", "algo=appo", "resources=cluster", "resources.num_env_runners=2", "resources.num_learners=1"),
    ("~experiment", "algo=impala", "resources.num_env_runners=1", "tune=asha"),
    ("~experiment", "algo=dqn", "resources=cluster", "resources.num_env_runners=2", "evaluation=off"),
]


@pytest.mark.parametrize("overrides", RLLIB_CASES, ids=[" ".join(c) for c in RLLIB_CASES])
def test_the_request_is_the_one_rllib_makes(overrides):
    """rl-submit places trainer.capacity.request without importing RLlib: it must be RLlib's own request for the
    AlgorithmConfig the trainer builds (the driver's bundle dropped for a plain run, zero amounts left out)."""
    from trainer.algo import build_algo_config

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose(config_name="config", overrides=list(overrides))
    config = build_algo_config(c)
    rllib = [{k: float(v) for k, v in b.items() if v} for b in config.algo_class.default_resource_request(config).bundles]
    if c.tune.scheduler == "none":
        rllib = rllib[1:]
    ours = request(c)
    assert [b for _, b in ours] == rllib, ours
