"""k8s/ stays what `make manifests` renders from the chart, and agrees with the trainer, serving and kind."""

import filecmp
import re
import subprocess
import sys

import pytest
import yaml

from chartkit import CHART, ROOT, versions

pytestmark = pytest.mark.chart

GENERATED = ["k8s/jobs/cartpole.yaml", "k8s/jobs/pong.yaml", "k8s/jobs/pong-ddp.yaml", "k8s/serve/rayservice.yaml"]


@pytest.fixture(scope="module")
def rendered(tools, tmp_path_factory):
    out = tmp_path_factory.mktemp("manifests")
    subprocess.run([str(ROOT / "hack" / "render-manifests.sh"), str(out)], check=True, capture_output=True)
    return out


def drifted(tree, rendered) -> list[str]:
    """The generated files under `tree` that differ from a fresh rendering."""
    return [rel for rel in GENERATED if (tree / rel).read_text() != (rendered / rel).read_text()]


@pytest.mark.parametrize("rel", GENERATED)
def test_k8s_manifest_matches_the_chart(rendered, rel):
    assert rel not in drifted(ROOT, rendered), f"{rel} drifted from the chart: run `make manifests` and commit the result"


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


def test_drift_is_detected(rendered, tmp_path):
    """The check bites: on a copy of k8s/ with one hand-edited manifest, the same comparison flags that file."""
    import shutil

    shutil.copytree(ROOT / "k8s", tmp_path / "k8s")
    target = tmp_path / "k8s/jobs/cartpole.yaml"
    text = target.read_text()
    edited = text.replace("replicas: 1", "replicas: 3", 1)
    assert edited != text
    target.write_text(edited)
    assert drifted(tmp_path, rendered) == ["k8s/jobs/cartpole.yaml"]


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
    # Its cluster goes when it ends: the workers at once, the head (logs, dashboard) a while later.
    rules = {(r["condition"].get("jobStatus") or r["condition"]["jobDeploymentStatus"], r["policy"]): r["condition"].get("ttlSeconds", 0)
             for r in job["spec"]["deletionStrategy"]["deletionRules"]}
    for end in ("SUCCEEDED", "FAILED", "Failed"):
        assert rules[(end, "DeleteWorkers")] == 0 and rules[(end, "DeleteCluster")] > 0, rules
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


@pytest.mark.parametrize("rel", ["k8s/jobs/cartpole.yaml", "k8s/jobs/pong.yaml", "k8s/jobs/pong-ddp.yaml"])
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
    assert "resources.no_such_knob" in proc.stderr, proc.stderr[-2000:]  # names the key


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
    # The hostPath PersistentVolume of the deploy-cluster release (k8s/values/kind.yaml) is the host folder that
    # every worker node mounts, so any Ray pod on any node sees the same checkpoints.
    kind_values = yaml.safe_load((ROOT / "k8s/values/kind.yaml").read_text())
    pv_path = kind_values["storage"]["hostPathVolume"]["path"]
    for n in workers:
        assert {"hostPath": "/tmp/rl-platform", "containerPath": pv_path} in n["extraMounts"]
    assert cfg["name"] == "rl-platform"


def test_job_and_serve_manifests_mount_the_claim_the_deploy_release_creates(tools):
    """k8s/jobs and k8s/serve mount storage.existingClaim; the release of k8s/values/kind.yaml (release and namespace
    rl-platform, as render-manifests.sh renders) creates that claim and the only PersistentVolume."""
    import subprocess as sp

    out = sp.run([tools.path("HELM"), "template", "rl-platform", str(CHART), "--namespace", "rl-platform",
                  "--kube-version", tools.kube_version, "-f", str(ROOT / "k8s/values/kind.yaml")],
                 capture_output=True, text=True, check=True).stdout
    release = [d for d in yaml.safe_load_all(out) if d]
    (claim,) = [d["metadata"]["name"] for d in release if d["kind"] == "PersistentVolumeClaim"]
    assert [d["kind"] for d in release].count("PersistentVolume") == 1
    for rel in GENERATED:
        docs = _docs(rel)
        assert {d["kind"] for d in docs} <= {"RayJob", "RayService"}, rel
        text = (ROOT / rel).read_text()
        assert "hostPath" not in text, rel
        claims = set(re.findall(r"claimName: (\S+)", text))
        assert claims == {claim}, (rel, claims)


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
