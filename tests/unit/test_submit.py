"""rl-submit without a cluster: names, the rendered RayJob (`--dry-run` through the real helm and chart), the trainer's
own config errors, and how API/connection failures and pod states are reported. The cluster tier
(tests/k8s/test_1b_submit.py) submits for real."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from rl_submit import cli as submit
from rl_submit import shape
from rl_submit.cli import MAX_NAME, Problem, dns1035, job_suffix
from trainer.capacity import request
from trainer_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _helm() -> str | None:
    try:
        return submit.find_helm(None)
    except Problem:
        return None


needs_helm = pytest.mark.usefixtures("built_helm")


def rl_submit(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real entry point, as a user runs it, with no kubeconfig anywhere (a dry run must not need one)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    base.update(KUBECONFIG="/nonexistent/kubeconfig", **(env or {}))
    return subprocess.run([sys.executable, "-m", "rl_submit", *args], cwd=ROOT, env=base, capture_output=True,
                          text=True, timeout=timeout)


def dry_run(*args: str) -> dict:
    proc = rl_submit("--dry-run", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # stdout holds the YAML and nothing else; nothing to say on stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert len(docs) == 1 and docs[0]["kind"] == "RayJob", proc.stdout[:500]
    return docs[0]


# -- names -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("cartpole_ppo", "cartpole-ppo"), ("Pong_PPO", "pong-ppo"), ("__a..b__", "a-b"), ("x--y", "x-y"), ("ok", "ok"),
])
def test_dns1035_lowercases_and_replaces_what_kubernetes_rejects(text, want):
    assert dns1035(text) == want


@pytest.mark.parametrize("experiment", ["cartpole_ppo", "pong_appo", "A" * 80, "9_lives", "__", "trading-dqn"])
@pytest.mark.parametrize("prefix", ["rl-platform-", "r-", "a" * 39 + "-"])
def test_generated_names_fit_kuberay_and_dns1035(experiment, prefix):
    for _ in range(20):
        name = prefix + job_suffix(experiment, MAX_NAME - len(prefix))
        assert len(name) <= MAX_NAME == 47, name
        assert DNS1035.match(name), name


def test_generated_names_are_unique_and_readable():
    names = {job_suffix("cartpole_ppo", 35) for _ in range(200)}
    assert len(names) == 200
    assert all(n.startswith("cartpole-ppo-") and len(n) == len("cartpole-ppo-") + 5 for n in names)
    assert job_suffix("pong_ppo", 35, rand="abcde") == "pong-ppo-abcde"
    assert job_suffix("a_very_long_experiment_name_that_goes_on", 12, rand="abcde") == "a-very-abcde"


# -- --dry-run: the chart renders, the trainer's configs validate --------------------------------------------------
@needs_helm
def test_dry_run_prints_only_the_rayjob_of_the_chart_with_the_overrides_last():
    job = dry_run("--name", "t1", "-n", "team-a", "algo.lr=5e-4", "resources.num_env_runners=1")
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == "rl-platform-t1" and meta["namespace"] == "team-a"
    assert meta["labels"]["rl-platform.io/experiment"] == "cartpole-ppo"
    argv = shlex.split(spec["entrypoint"])
    # The chart's command, the default values file's shape overrides, then the user's (Hydra: the last one wins).
    assert argv == ["python", "-m", "trainer", "experiment=cartpole_ppo", "resources=cluster",
                    "output_dir=/mnt/rl-platform/results/cartpole/rl-platform-t1",
                    "resources.num_gpus_per_learner=0", "resources.num_env_runners=2",
                    "registry.root=/mnt/rl-platform/registry", "algo.lr=5e-4", "resources.num_env_runners=1"]
    # Cluster shape straight from the chart + k8s/values/cartpole.yaml (its own RayCluster, restricted pods).
    groups = {g["groupName"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]}
    assert groups == {"rollout-cpu", "learner-cpu"}
    assert spec["submissionMode"] == "K8sJobMode" and "shutdownAfterJobFinishes" not in spec
    assert {r["policy"] for r in spec["deletionStrategy"]["deletionRules"]} == {"DeleteWorkers", "DeleteCluster"}
    pod = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True


@needs_helm
def test_dry_run_is_exactly_what_helm_renders_for_the_same_values():
    job = dry_run("--name", "t2", "-n", "rl-platform")
    out = subprocess.run([_helm(), "template", "rl-platform", str(ROOT / "charts" / "rl-platform"), "-n", "rl-platform",
                          "-f", str(ROOT / "k8s" / "values" / "cartpole.yaml"), "--set", "rayJob.name=t2",
                          "--set", "rayJob.outputDir=/mnt/rl-platform/results/cartpole/rl-platform-t2",
                          "--show-only", "templates/rayjob.yaml"], capture_output=True, text=True, check=True).stdout
    want = yaml.safe_load(out)
    want["metadata"]["namespace"] = "rl-platform"
    assert job == want


@needs_helm
def test_a_shape_without_a_pool_is_submittable_with_the_override_the_chart_asks_for():
    # No rollout group: the chart asks for resources.num_env_runners=0, and rl-submit takes it from the command line.
    shape_args = ("--set", "workerGroups.rollout-cpu.enabled=false")
    refused = rl_submit("--dry-run", *shape_args)
    assert refused.returncode == 2 and "resources.num_env_runners=0" in refused.stderr, refused.stderr
    job = dry_run(*shape_args, "--name", "t3", "resources.num_env_runners=0", "algo.lr=0.001")
    argv = shlex.split(job["spec"]["entrypoint"])
    values = yaml.safe_load((ROOT / "k8s" / "values" / "cartpole.yaml").read_text())["rayJob"]["overrides"]
    # The values' overrides once, then the user's, in order.
    assert argv[-len(values) - 2:] == values + ["resources.num_env_runners=0", "algo.lr=0.001"], argv
    assert [g["groupName"] for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]] == ["learner-cpu"]


@needs_helm
def test_experiment_picks_name_label_and_its_own_output_folder():
    job = dry_run("experiment=pong_ppo")
    name = job["metadata"]["name"]
    assert re.fullmatch(r"rl-platform-pong-ppo-[a-z0-9]{5}", name), name
    assert job["metadata"]["labels"]["rl-platform.io/experiment"] == "pong-ppo"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert "experiment=pong_ppo" in argv and f"output_dir=/mnt/rl-platform/results/cartpole/{name}" in argv
    assert dry_run("experiment=pong_ppo")["metadata"]["name"] != name  # every submission is a new job


@needs_helm
def test_output_dir_override_is_the_jobs_output_dir():
    argv = shlex.split(dry_run("output_dir=s3://bucket/runs/a")["spec"]["entrypoint"])
    assert [a for a in argv if a.startswith("output_dir=")] == ["output_dir=s3://bucket/runs/a"]


@needs_helm
def test_values_with_shell_characters_reach_the_trainer_unchanged():
    job = dry_run("env=trading", "~experiment", "env.env_config.symbols=[AAA,BBB,CCC]", "algo=dqn")
    argv = shlex.split(job["spec"]["entrypoint"])  # the submitter's shell splits it like this
    assert "env.env_config.symbols=[AAA,BBB,CCC]" in argv and "~experiment=cartpole_ppo" in argv
    assert job["metadata"]["name"].startswith("rl-platform-run-")


@needs_helm
def test_use_existing_cluster_selects_the_release_raycluster():
    spec = dry_run("--use-existing-cluster", "--name", "t3")["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": "rl-platform"}
    assert "rayClusterSpec" not in spec
    spec = dry_run("--cluster-selector", "team-cluster", "--name", "t3")["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": "team-cluster"} and "rayClusterSpec" not in spec


@needs_helm
def test_values_and_set_change_the_cluster_shape(tmp_path):
    values = tmp_path / "v.yaml"
    # The values' overrides replace cartpole.yaml's: its CPU learner (num_gpus_per_learner=0) is restated.
    values.write_text("rayJob: {outputDir: /data/runs, overrides: [resources.num_gpus_per_learner=0, "
                      "resources.num_env_runners=8]}\n"
                      "workerGroups: {rollout-cpu: {replicas: 4, minReplicas: 1, maxReplicas: 8}}\n")
    job = dry_run("-f", str(ROOT / "k8s" / "values" / "cartpole.yaml"), "-f", str(values),
                  "--set", "workerGroups.rollout-cpu.cpus=3", "--name", "t4")
    rollout = next(g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"] if g["groupName"] == "rollout-cpu")
    assert rollout["replicas"] == 4 and rollout["rayStartParams"]["num-cpus"] == "3"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert "output_dir=/data/runs/rl-platform-t4" in argv and argv[-1] == "resources.num_env_runners=8"


# -- bad input: the trainer's errors and exit codes, nothing rendered --------------------------------------------
def _trainer(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@needs_helm
@pytest.mark.parametrize("overrides, code, needle", [
    (["algo.lr=fast"], 1, "full_key: algo.lr"),
    (["experiment=atlantis"], 1, "Could not find 'experiment/atlantis'"),
    (["algo.lrr=0.1"], 1, "algo.lrr"),
    (["stop.env_steps=0"], 2, "error: stop.env_steps must be > 0, got 0"),
    (["+algo.lrr=0.1"], 2, "error: unknown key algo.lrr"),
])
def test_bad_config_fails_like_the_trainer(overrides, code, needle):
    proc = rl_submit("--dry-run", *overrides)
    assert (proc.returncode, proc.stdout) == (code, ""), proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    trainer = _trainer(*overrides)
    assert trainer.returncode == code
    # The same first line the trainer prints (Hydra's message, or the trainer's own `error: ...`).
    assert proc.stderr.splitlines()[0] == trainer.stderr.splitlines()[0]


@needs_helm
@pytest.mark.parametrize("args, needle", [
    (["tags=[a, b]"], "contains whitespace"),
    (["-m", "algo.lr=1e-3,5e-4"], "one experiment per RayJob"),
    (["--name", "a-name-that-is-far-too-long-for-kuberay-to-take"], "KubeRay accepts at most 47"),
    (["--name", "Bad_Name"], "--name 'Bad_Name': use lowercase letters, digits and '-'"),
    (["-f", "/nonexistent/values.yaml"], "/nonexistent/values.yaml"),
])
def test_bad_submit_input_is_one_line_and_exit_2(args, needle):
    proc = rl_submit("--dry-run", *args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- the cluster shape: a job its RayCluster can never hold is refused before the API server --------------------------
GPU_LEARNER = ("resources.num_gpus_per_learner=1", "resources.num_learners=1")


def _refused(proc: subprocess.CompletedProcess) -> str:
    """The one stderr line of a job refused for its cluster shape (exit 2, nothing on stdout)."""
    assert (proc.returncode, proc.stdout) == (2, ""), \
        f"not refused (exit {proc.returncode}): {proc.stderr or proc.stdout[:300]}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "can never run on" in lines[0], proc.stderr
    return lines[0]


@needs_helm
def test_a_gpu_learner_on_the_cpu_only_default_cluster_is_refused_naming_gpu_and_the_closest_group(tmp_path):
    line = _refused(rl_submit("--dry-run", *GPU_LEARNER))
    assert line == ("error: this job can never run on its own RayCluster (-f k8s/values/cartpole.yaml): learner 1 "
                    "needs {CPU: 1, GPU: 1, learner_pool: 1} on one node, and no node of this cluster has GPU 1 "
                    "(largest group learner-cpu: {CPU: 1, learner_pool: 1} per node)")
    # Refused before any API call: an unreachable API server would be exit 3, `cannot reach`.
    kc = _kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}")
    assert _refused(rl_submit("--kubeconfig", kc, "--name", "gpu", *GPU_LEARNER)) == line


@needs_helm
def test_a_gpu_learner_fits_the_values_with_a_gpu_learner_group():
    job = dry_run("-f", str(ROOT / "k8s" / "values" / "pong.yaml"), *GPU_LEARNER)
    groups = {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    limits = groups["learner-gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert shape.quantity(limits["nvidia.com/gpu"]) == 1
    assert shlex.split(job["spec"]["entrypoint"])[-2:] == list(GPU_LEARNER)


@needs_helm
def test_more_env_runners_than_the_rollout_group_holds_are_refused_naming_rollout_pool(tmp_path):
    # k8s/values/cartpole.yaml: one rollout-cpu node (2 CPUs, rollout_pool 2), no autoscaling.
    line = _refused(rl_submit("--dry-run", "resources.num_env_runners=3"))
    assert line.endswith("3 env runners need {CPU: 1, rollout_pool: 1} each; the job needs rollout_pool 3 in all "
                         "and the cluster has at most rollout_pool 2 (group rollout-cpu: 1 node (replicas, "
                         "no autoscaling) x {CPU: 2, rollout_pool: 2})"), line
    # With the autoscaler the group may grow to maxReplicas: 2 nodes hold 4 env runners, not 5.
    autoscaled = tmp_path / "autoscaled.yaml"
    autoscaled.write_text("autoscaling: {enabled: true}\n"
                          "workerGroups: {rollout-cpu: {replicas: 1, minReplicas: 1, maxReplicas: 2}}\n")
    shape = ("-f", str(ROOT / "k8s" / "values" / "cartpole.yaml"), "-f", str(autoscaled))
    dry_run(*shape, "resources.num_env_runners=4")
    line = _refused(rl_submit("--dry-run", *shape, "resources.num_env_runners=5"))
    assert "rollout_pool 5 in all and the cluster has at most rollout_pool 4 (group rollout-cpu: at most 2 nodes " \
           "(maxReplicas) x {CPU: 2, rollout_pool: 2})" in line, line


@needs_helm
def test_use_existing_cluster_is_checked_against_the_release_raycluster():
    kind = str(ROOT / "k8s" / "values" / "kind.yaml")  # the release the local cluster runs: 1 rollout node
    assert "clusterSelector" in dry_run("-f", kind, "--use-existing-cluster", "tune=asha")["spec"]
    line = _refused(rl_submit("--dry-run", "-f", kind, "--use-existing-cluster", "resources.num_env_runners=3"))
    assert line.startswith("error: this job can never run on RayCluster rl-platform (-f k8s/values/kind.yaml): "
                           "3 env runners need {CPU: 1, rollout_pool: 1} each; the job needs rollout_pool 3 "
                           "in all"), line
    line = _refused(rl_submit("--dry-run", "-f", kind, "--use-existing-cluster", *GPU_LEARNER))
    assert "no node of this cluster has GPU 1 (largest group learner-cpu: {CPU: 1, learner_pool: 1} per node)" in line
    # Another RayCluster (--cluster-selector): its shape is not the chart's to render, so it is not judged here.
    assert dry_run("-f", kind, "--cluster-selector", "team-cluster", *GPU_LEARNER)["spec"]["clusterSelector"] == \
        {"ray.io/cluster": "team-cluster"}


def _group(name: str, cpus: int, pool: str | None = None, gpus: int = 0, replicas: int = 1, max_replicas: int = 1):
    """A worker group as the chart renders one: Ray CPUs from the CPU limit, the pool in rayStartParams."""
    limits = {"cpu": str(cpus), "memory": "2Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
    params = {"resources": f"'{json.dumps({f'{pool}_pool': gpus or cpus})}'"} if pool else {}
    return {"groupName": name, "replicas": replicas, "minReplicas": 0, "maxReplicas": max_replicas,
            "rayStartParams": params, "template": {"spec": {"containers": [{"name": "ray-worker",
                                                                            "resources": {"limits": limits}}]}}}


def _cluster(*workers: dict, head_cpus: int = 0, autoscaling: bool = False) -> dict:
    head = {"rayStartParams": {"num-cpus": str(head_cpus)},
            "template": {"spec": {"containers": [{"name": "ray-head", "resources": {"limits": {"cpu": "2"}}}]}}}
    return {"enableInTreeAutoscaling": autoscaling, "headGroupSpec": head, "workerGroupSpecs": list(workers)}


RUNNER, LEARNER = {"CPU": 1.0, "rollout_pool": 1.0}, {"CPU": 1.0, "learner_pool": 1.0}
GPU_BUNDLE = {"CPU": 1.0, "GPU": 1.0, "learner_pool": 1.0}


def test_shape_reads_what_each_node_advertises_and_how_many_nodes_a_group_may_have():
    spec = _cluster(_group("rollout-cpu", 2, "rollout", replicas=1, max_replicas=3),
                    _group("learner-gpu", 4, "learner", gpus=1), head_cpus=1)
    fixed = {g.name: (g.resources, g.count, g.bound) for g in shape.groups(spec)}
    assert fixed == {"head": ({"CPU": 1.0}, 1, "head"),
                     "rollout-cpu": ({"CPU": 2.0, "rollout_pool": 2.0}, 1, "replicas"),
                     "learner-gpu": ({"CPU": 4.0, "GPU": 1.0, "learner_pool": 1.0}, 1, "replicas")}
    spec["enableInTreeAutoscaling"] = True
    assert [(n, r) for n, r in shape.nodes(shape.groups(spec)) if n.startswith("rollout")] == \
        [(f"rollout-cpu#{i}", {"CPU": 2.0, "rollout_pool": 2.0}) for i in range(3)]


def test_shape_places_biggest_bundles_first():
    # In request order a driver's {CPU} would take the learner node's only CPU; biggest first leaves it the head's.
    free = [("learner#0", {"CPU": 1.0, "learner_pool": 1.0}), ("head#0", {"CPU": 1.0})]
    assert shape.place([{"CPU": 1.0}, LEARNER], free) == []
    assert shape.place([{"CPU": 1.0}, {"CPU": 1.0}, LEARNER], free) == [{"CPU": 1.0}]
    assert shape.place([RUNNER] * 3, [("rollout#0", {"CPU": 2.0, "rollout_pool": 2.0})]) == [RUNNER]


@pytest.mark.parametrize("request_, want", [
    ([("env runner 1", RUNNER), ("env runner 2", RUNNER), ("learner 1", LEARNER)], None),
    ([("the Tune trial driver", {"CPU": 1.0}), ("env runner 1", RUNNER), ("env runner 2", RUNNER),
      ("learner 1", LEARNER)],
     "the Tune trial driver needs {CPU: 1}; the job needs CPU 4 in all and the cluster has at most CPU 3 (group "
     "rollout-cpu: 1 node (replicas, no autoscaling) x {CPU: 2, rollout_pool: 2}; group learner-cpu: 1 node "
     "(replicas, no autoscaling) x {CPU: 1, learner_pool: 1})"),
    ([("env runner 1", RUNNER), ("learner 1", GPU_BUNDLE), ("learner 2", GPU_BUNDLE)],
     "2 learners need {CPU: 1, GPU: 1, learner_pool: 1} each on one node, and no node of this cluster has GPU 1 "
     "(largest group learner-cpu: {CPU: 1, learner_pool: 1} per node)"),
    ([(f"env runner {i + 1}", RUNNER) for i in range(3)],
     "3 env runners need {CPU: 1, rollout_pool: 1} each; the job needs rollout_pool 3 in all and the cluster has "
     "at most rollout_pool 2 (group rollout-cpu: 1 node (replicas, no autoscaling) x {CPU: 2, rollout_pool: 2})"),
])
def test_shape_names_what_cannot_be_placed(request_, want):
    cluster = shape.groups(_cluster(_group("rollout-cpu", 2, "rollout"), _group("learner-cpu", 1, "learner")))
    assert shape.misfit(request_, cluster) == want


def test_shape_counts_a_group_without_nodes_as_holding_nothing():
    cluster = shape.groups(_cluster(_group("rollout-cpu", 2, "rollout", replicas=0, max_replicas=4), head_cpus=1))
    assert shape.misfit([("env runner 1", RUNNER)], cluster) == (
        "env runner 1 needs {CPU: 1, rollout_pool: 1} on one node, and no node of this cluster has rollout_pool 1 "
        "(largest group head: {CPU: 1} per node; group rollout-cpu would hold it but has 0 nodes (replicas, "
        "no autoscaling))")
    autoscaled = shape.groups(_cluster(_group("rollout-cpu", 2, "rollout", replicas=0, max_replicas=4),
                                       autoscaling=True))
    assert shape.misfit([("env runner 1", RUNNER)] * 8, autoscaled) is None


def test_the_fit_check_places_the_trainers_request_for_the_composed_config():
    """The composed config's request (trainer.capacity, checked against RLlib's in tests/unit/test_capacity.py): a
    plain run leaves the driver to the entrypoint process."""
    overrides = ["resources=cluster", "resources.num_env_runners=2", *GPU_LEARNER]
    plain = request(submit.compose_and_validate(overrides))
    assert plain == [("env runner 1", RUNNER), ("env runner 2", RUNNER), ("learner 1", GPU_BUNDLE)]
    tune = request(submit.compose_and_validate([*overrides, "tune=asha"]))
    assert tune == [("the Tune trial driver", {"CPU": 1.0}), *plain]


@needs_helm
def test_installed_without_the_repo_the_chart_comes_from_chart(tmp_path, monkeypatch, capsys):
    """A wheel has no charts/ or k8s/: `--chart` (a folder, a `helm package` .tgz or oci://) and `-f` say what to use."""
    helm = _helm()
    subprocess.run([helm, "package", str(ROOT / "charts" / "rl-platform"), "-d", str(tmp_path)], check=True,
                   capture_output=True)
    tgz = next(tmp_path.glob("rl-platform-*.tgz"))
    monkeypatch.setattr(submit, "REPO", tmp_path / "site-packages")
    monkeypatch.setenv("HELM", helm)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    assert submit.main(["--dry-run", "--name", "w1"]) == 3
    assert "chart not found" in capsys.readouterr().err
    values = str(ROOT / "k8s" / "values" / "cartpole.yaml")
    assert submit.main(["--dry-run", "--name", "w1", "--chart", str(tgz), "-f", values]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["metadata"]["name"] == "rl-platform-w1"


def test_missing_helm_or_chart_is_reported(tmp_path):
    proc = rl_submit("--dry-run", "--chart", str(tmp_path / "nochart"), env={"HELM": "/bin/true"})
    assert proc.returncode == 3 and proc.stderr.startswith("error: chart not found at"), proc.stderr
    proc = rl_submit("--dry-run", "--helm", str(tmp_path / "nohelm"))
    assert proc.returncode == 3 and proc.stderr.startswith("error: helm not found at"), proc.stderr


def test_subcommands_are_found_among_the_flags(monkeypatch):
    seen = []
    for cmd in submit.COMMANDS:
        monkeypatch.setitem(submit.COMMANDS, cmd, lambda a, cmd=cmd: seen.append((cmd, a)) or 0)
    monkeypatch.setattr(submit, "cmd_submit", lambda a: seen.append(("submit", a)) or 0)
    assert submit.main(["-n", "ns", "stop", "--context", "c", "job-1"]) == 0
    cmd, a = seen.pop()
    assert (cmd, a.name, a.namespace, a.context) == ("stop", "job-1", "ns", "c")
    submit.main(["logs", "-f", "job-2"])
    cmd, a = seen.pop()
    assert (cmd, a.name, a.follow) == ("logs", "job-2", True)
    submit.main(["--name", "stop", "algo.lr=1e-3"])  # the value of --name, not the subcommand
    cmd, a = seen.pop()
    assert (cmd, a.name, a.overrides) == ("submit", "stop", ["algo.lr=1e-3"])


# -- reporting: connection and API errors, pod and job states ----------------------------------------------------
KUBE = submit.Kube(api=None, namespace="team-a", server="https://127.0.0.1:6443", context="ctx")


def _api_error(status: int, body: dict) -> ApiException:
    e = ApiException(status=status, reason="x")
    e.body = json.dumps(body)
    return e


def test_rbac_quota_namespace_and_auth_errors_are_one_line_naming_the_problem():
    rbac = _api_error(403, {"reason": "Forbidden", "message": 'rayjobs.ray.io is forbidden: User "system:serviceaccount:'
                            'team-a:viewer" cannot create resource "rayjobs" in API group "ray.io" in the namespace "team-a"'})
    p = submit.explain(rbac, KUBE, "create rayjobs.ray.io")
    assert str(p).startswith("forbidden by RBAC, cannot create rayjobs.ray.io in namespace 'team-a'") and p.code == 3
    assert 'cannot create resource "rayjobs"' in str(p)
    quota = _api_error(403, {"reason": "Forbidden", "message": 'rayjobs.ray.io "x" is forbidden: exceeded quota: q, '
                             'requested: count/rayjobs.ray.io=1, used: count/rayjobs.ray.io=0, limited: count/rayjobs.ray.io=0'})
    assert str(submit.explain(quota, KUBE, "create rayjobs.ray.io")).startswith("quota exceeded in namespace 'team-a'")
    ns = _api_error(404, {"reason": "NotFound", "message": 'namespaces "team-a" not found',
                          "details": {"name": "team-a", "kind": "namespaces"}})
    assert "namespace 'team-a' does not exist" in str(submit.explain(ns, KUBE, "create rayjobs.ray.io"))
    assert "rejected the credentials" in str(submit.explain(_api_error(401, {}), KUBE, "x"))
    for p in (submit.explain(e, KUBE, "x") for e in (rbac, quota, ns)):
        assert "\n" not in str(p)


def _pod(waiting_reason: str | None, phase: str = "Pending", message: str = "") -> client.V1Pod:
    state = client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason=waiting_reason, message=message)) \
        if waiting_reason else client.V1ContainerState(running=client.V1ContainerStateRunning())
    return client.V1Pod(metadata=client.V1ObjectMeta(name="p"), spec=client.V1PodSpec(containers=[], node_name="n1"),
                        status=client.V1PodStatus(phase=phase, container_statuses=[client.V1ContainerStatus(
                            name="ray-head", image="rl-platform:nope", image_id="", ready=False, restart_count=0,
                            state=state)]))


@pytest.mark.parametrize("reason", sorted(submit.IMAGE_REASONS))
def test_image_problems_are_recognised_as_the_kubelet_reports_them(reason):
    line = submit.image_problem(_pod(reason, message='Container image "rl-platform:nope" is not present with pull policy of Never'))
    assert line.startswith(f"image rl-platform:nope cannot be used by pod p on node n1: {reason}")


@pytest.mark.parametrize("reason", [None, "ContainerCreating", "CrashLoopBackOff"])
def test_other_pod_states_are_no_image_problem(reason):
    assert submit.image_problem(_pod(reason)) is None


@pytest.mark.parametrize("status, code", [
    ({}, None), ({"jobDeploymentStatus": "Initializing"}, None),
    ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, None),
    ({"jobDeploymentStatus": "Running", "jobStatus": "SUCCEEDED"}, None),  # until the submitter has finished too
    ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, 0),
    ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}, 4),
    ({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}, 4),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, 5),
    ({"jobDeploymentStatus": "Suspended"}, 5),
    ({"jobDeploymentStatus": "ValidationFailed", "message": "name too long"}, 3),
])
def test_exit_code_mirrors_the_job(status, code):
    assert submit.outcome(status) == code


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}]}))
    return str(path)


def test_no_kubeconfig_is_one_line_and_exit_3():
    proc = rl_submit("--name", "t5")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("error: no kubeconfig: /nonexistent/kubeconfig does not exist"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_context_namespace_is_the_default_namespace(tmp_path):
    kc = _kubeconfig(tmp_path, "https://127.0.0.1:1")
    assert submit.kube_namespace(kc, None) == "team-a"
    assert submit.connect(kc, None, None).namespace == "team-a"
    assert submit.connect(kc, None, "other").namespace == "other"
    with pytest.raises(Problem, match="kubeconfig: .*nope"):
        submit.connect(kc, "nope", None)


@needs_helm
def test_unreachable_api_server_is_one_line_and_fast(tmp_path):
    kc = _kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    proc = rl_submit("--kubeconfig", kc, "--name", "t6")
    assert proc.returncode == 3, proc.stderr
    assert re.fullmatch(r"error: cannot reach the Kubernetes API at https://127\.0\.0\.1:\d+: connection refused\n",
                        proc.stderr), proc.stderr
    assert time.monotonic() - t0 < 30


def test_an_api_server_that_never_answers_times_out_within_the_bound(tmp_path):
    listener = socket.socket()  # accepts TCP connections (kernel backlog) but never speaks TLS
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        kube = submit.connect(_kubeconfig(tmp_path, f"https://127.0.0.1:{listener.getsockname()[1]}"), None, None)
        t0 = time.monotonic()
        with pytest.raises(Problem, match=r"cannot reach the Kubernetes API at https://127\.0\.0\.1:\d+: .*timed out"):
            submit.check_kuberay(kube)
        assert time.monotonic() - t0 < submit.READ_S + 10
    finally:
        listener.close()
