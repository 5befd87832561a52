"""trainer.capacity: a request is compared with the nodes' resources before the algorithm is built."""

from types import SimpleNamespace

import pytest

from trainer.capacity import check_capacity, request, shortfall
from trainer.errors import TrainerError




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
    assert request(cfg().resources, tune=False) == []
    assert shortfall([], CPU2) is None


def test_a_gpu_learner_on_a_cpu_only_ray_names_gpu():
    req = request(cfg(num_learners=1, num_gpus_per_learner=1.0).resources, tune=False)
    why = shortfall(req, CPU2)
    assert why and "GPU 1" in why and "learner" in why


def test_eval_env_runners_ask_for_the_rollout_pool_too():
    c = cfg(num_env_runners=1, rollout_resource="rollout_pool", eval_env_runners=1)
    req = request(c.resources, tune=False, eval_env_runners=1)
    assert req == [("an env runner", {"CPU": 1.0, "rollout_pool": 1.0})] * 1 + [
        ("an evaluation env runner", {"CPU": 1.0, "rollout_pool": 1.0})]
    # One rollout_pool unit fits the training env runner, not the eval one as well.
    with pytest.raises(TrainerError, match="rollout_pool 2"):
        check_capacity(c, print, nodes=lambda: [{"CPU": 4.0, "rollout_pool": 1.0}])


def test_a_missing_pool_resource_names_the_pool():
    req = request(cfg(num_env_runners=1, rollout_resource="rollout_pool").resources, tune=False)
    assert "rollout_pool" in shortfall(req, CPU2)


def test_too_many_cpus_in_total_names_cpu():
    req = request(cfg(num_env_runners=3).resources, tune=False)
    why = shortfall(req, CPU2)
    assert "CPU 3" in why and "CPU 2" in why
    assert shortfall(req, CPU2 + [{"CPU": 1.0}]) is None


def test_each_bundle_must_fit_one_node():
    req = request(cfg(num_learners=1, num_cpus_per_learner=2.0).resources, tune=False)
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
        check_capacity(c, print, nodes=nodes)
    assert len(calls) >= 2  # looked again before giving up


def test_a_cluster_that_grows_in_time_passes():
    seen = iter([CPU2] + [CPU2 + [{"CPU": 1.0, "rollout_pool": 1.0}]] * 100)
    c = cfg(num_env_runners=1, rollout_resource="rollout_pool", address="head:6379", wait_for_resources_s=30)
    check_capacity(c, print, nodes=lambda: next(seen))
