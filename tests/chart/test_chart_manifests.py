"""k8s/ stays what `make manifests` renders from the chart, and agrees with the trainer, serving and kind."""

import filecmp
import subprocess
import sys

import pytest
import yaml

from chartkit import CHART, ROOT, versions

pytestmark = pytest.mark.chart

GENERATED = ["k8s/jobs/cartpole.yaml", "k8s/jobs/pong.yaml", "k8s/serve/rayservice.yaml"]


@pytest.fixture(scope="module")
def rendered(tools, tmp_path_factory):
    out = tmp_path_factory.mktemp("manifests")
    subprocess.run([str(ROOT / "hack" / "render-manifests.sh"), str(out)], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("rel", GENERATED)
def test_k8s_manifest_matches_the_chart(rendered, rel):
    fresh = (rendered / rel).read_text()
    committed = (ROOT / rel).read_text()
    assert committed == fresh, f"{rel} drifted from the chart: run `make manifests` and commit the result"


def test_no_stale_generated_files(rendered):
    for sub in ("jobs", "serve"):
        ours = {p.name for p in (ROOT / "k8s" / sub).glob("*.yaml")}
        fresh = {p.name for p in (rendered / "k8s" / sub).glob("*.yaml")}
        assert ours == fresh, f"k8s/{sub}: {ours ^ fresh} not produced by `make manifests`"


def test_chart_serve_config_is_a_copy_of_the_serving_config():
    src = ROOT / "serving" / "serve_config.yaml"
    if not src.exists():
        pytest.skip("serving/serve_config.yaml does not exist yet (the chart keeps its placeholder)")
    assert filecmp.cmp(src, CHART / "files" / "serve_config.yaml", shallow=False), \
        "charts/rl-platform/files/serve_config.yaml differs from serving/serve_config.yaml: run `make manifests`"


def test_drift_is_detected(tools, tmp_path):
    """The comparison bites: a hand edit of a generated file differs from a fresh rendering."""
    subprocess.run([str(ROOT / "hack" / "render-manifests.sh"), str(tmp_path)], check=True, capture_output=True)
    edited = (ROOT / "k8s/jobs/cartpole.yaml").read_text().replace("replicas: 1", "replicas: 3", 1)
    assert edited != (tmp_path / "k8s/jobs/cartpole.yaml").read_text()


def _docs(rel):
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


def _groups(cluster_spec):
    return {g["groupName"]: g for g in cluster_spec["workerGroupSpecs"]}


def test_pong_job_runs_on_the_rollout_pool_and_a_gpu_learner():
    (job,) = _docs("k8s/jobs/pong.yaml")
    assert job["kind"] == "RayJob"
    assert job["spec"]["entrypoint"].startswith("python -m trainer experiment=pong_ppo resources=cluster output_dir=")
    groups = _groups(job["spec"]["rayClusterSpec"])
    rollout, learner = groups["rollout-cpu"], groups["learner-gpu"]
    assert "rollout_pool" in rollout["rayStartParams"]["resources"]
    assert "nvidia.com/gpu" not in rollout["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "learner_pool" in learner["rayStartParams"]["resources"]
    assert learner["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert learner["template"]["spec"]["containers"][0]["image"] == versions()["IMAGE_GPU"]


def test_cartpole_job_is_cpu_only():
    (job,) = _docs("k8s/jobs/cartpole.yaml")
    assert "resources.num_gpus_per_learner=0" in job["spec"]["entrypoint"].split()
    assert "nvidia.com/gpu" not in yaml.safe_dump(job)
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    groups = _groups(job["spec"]["rayClusterSpec"])
    # The trainer's resources=cluster places env runners on rollout_pool and learners on learner_pool.
    assert any("rollout_pool" in g["rayStartParams"].get("resources", "") for g in groups.values())
    assert any("learner_pool" in g["rayStartParams"].get("resources", "") for g in groups.values())


def test_rayservice_serves_the_serving_config_with_the_pong_checkpoint():
    (svc,) = _docs("k8s/serve/rayservice.yaml")
    config = yaml.safe_load(svc["spec"]["serveConfigV2"])
    source = yaml.safe_load((CHART / "files" / "serve_config.yaml").read_text())
    assert [a["import_path"] for a in config["applications"]] == [a["import_path"] for a in source["applications"]]
    assert config["http_options"]["port"] == 8000
    (pong,) = _docs("k8s/jobs/pong.yaml")
    out_dir = pong["spec"]["entrypoint"].split("output_dir=")[1].split()[0]
    checkpoints = [d["user_config"]["policies"]["default"]["checkpoint"]
                   for a in config["applications"] for d in a.get("deployments", [])
                   if "policies" in d.get("user_config", {})]
    assert checkpoints and all(c.startswith(out_dir + "/") for c in checkpoints)


@pytest.mark.parametrize("rel", ["k8s/jobs/cartpole.yaml", "k8s/jobs/pong.yaml"])
def test_job_entrypoint_composes_with_the_trainers_hydra_config(rel):
    """Run the real entrypoint with `--cfg job`: Hydra composes the config and rejects unknown overrides."""
    if not (ROOT / "trainer" / "__main__.py").exists():
        pytest.skip("trainer/__main__.py not present yet")
    (job,) = _docs(rel)
    argv = job["spec"]["entrypoint"].split()
    assert argv[:3] == ["python", "-m", "trainer"]
    proc = subprocess.run([sys.executable, "-m", "trainer", *argv[3:], "--cfg", "job"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["output_dir"] == argv[5].split("=", 1)[1]
    assert composed["resources"]["rollout_resource"] == "rollout_pool"
    assert composed["resources"]["learner_resource"] == "learner_pool"


def test_hydra_check_rejects_an_unknown_override():
    if not (ROOT / "trainer" / "__main__.py").exists():
        pytest.skip("trainer/__main__.py not present yet")
    proc = subprocess.run([sys.executable, "-m", "trainer", "experiment=cartpole_ppo", "resources=cluster",
                           "resources.no_such_knob=1", "--cfg", "job"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0


def test_kind_nodes_match_the_chart_pools():
    cfg = yaml.safe_load((ROOT / "k8s/kind/cluster.yaml").read_text())
    assert cfg["kind"] == "Cluster" and cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    workers = [n for n in cfg["nodes"] if n["role"] == "worker"]
    labels = [n.get("labels", {}) for n in workers]
    for name, group in values["workerGroups"].items():
        assert group["nodeSelector"] in labels, f"no kind node for workerGroups.{name}.nodeSelector"
    gpu_node = next(n for n in workers if n.get("labels") == values["workerGroups"]["learner-gpu"]["nodeSelector"])
    patch = yaml.safe_load(gpu_node["kubeadmConfigPatches"][0])
    taints = patch["nodeRegistration"]["taints"]
    tol = values["gpuToleration"]
    assert any(t["key"] == tol["key"] and t["effect"] == tol["effect"] for t in taints)
    cpu_node = next(n for n in workers if n.get("labels") == values["workerGroups"]["rollout-cpu"]["nodeSelector"])
    assert "kubeadmConfigPatches" not in cpu_node, "the CPU pool must not carry the GPU taint"
    # Shared storage of k8s/values/*.yaml (storage.hostPath) is mounted on every worker node.
    for n in workers:
        assert {"hostPath": "/tmp/rl-platform", "containerPath": "/mnt/rl-platform"} in n["extraMounts"]
    assert cfg["name"] == "rl-platform"


def test_chart_readme_is_up_to_date(rendered):
    fresh = (rendered / "charts/rl-platform/README.md").read_text()
    assert (CHART / "README.md").read_text() == fresh, "charts/rl-platform/README.md is stale: run `make manifests`"


def test_every_value_is_documented():
    """Each leaf of values.yaml carries a `# --` comment on itself or on an ancestor (helm-docs habit)."""
    sys.path.insert(0, str(ROOT / "hack"))
    import importlib

    readme = importlib.import_module("chart-readme")
    text = (CHART / "values.yaml").read_text()
    documented = {k for k, _ in readme.documented_keys(text)}

    def leaves(node, prefix=()):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                yield from leaves(v, (*prefix, k))
        else:
            yield prefix

    undocumented = [".".join(p) for p in leaves(yaml.safe_load(text))
                    if not any(".".join(p[:i]) in documented for i in range(1, len(p) + 1))]
    assert undocumented == []
