"""Benchmark: placement at scale on the local cluster tier (real API server, scheduler and KubeRay operator; KWOK
fake nodes). For each size, N nodes (80% CPU rollout pool, 20% GPU learner nodes with the chart's taint) and one
RayCluster from the chart with hundreds of rollout workers and one learner per GPU node; reports apply -> all pods
scheduled, checks every pod landed in its pool, and writes bench/results/k8s_scale.json.

    make cluster-up LEVEL=a && make bench-k8s-scale [SCALE_SIZES=10,100,500]

The machine is shared and noisy: compare sizes within one run, not runs across machines. Measured on 2 cores: the
rate falls from ~15 to ~10 pods/s between 10 and 500 nodes (apiserver, scheduler, operator and KWOK share the 2
cores; which of them bounds the rate was not measured).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[1]
NS = "rl-scale"


def tool_env() -> dict[str, str]:
    out = subprocess.run([str(REPO / "hack" / "tools.sh"), "env"], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def kubeconfig() -> str:
    line = subprocess.run([str(REPO / "hack" / "cluster.sh"), "env"], check=True, capture_output=True, text=True).stdout
    return line.split("KUBECONFIG=", 1)[1].split()[0]


def make_nodes(core: client.CoreV1Api, n: int) -> tuple[list[str], list[str]]:
    gpu = max(1, n // 5)
    cpu_nodes, gpu_nodes = [f"scale-cpu-{i}" for i in range(n - gpu)], [f"scale-gpu-{i}" for i in range(gpu)]
    for name in cpu_nodes + gpu_nodes:
        is_gpu = name.startswith("scale-gpu")
        labels = {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "rl-platform.io/pool": "gpu" if is_gpu else "cpu", "rl-platform.io/node": "fake", "rl-scale": "1"}
        cap = {"cpu": "8", "memory": "64Gi", "pods": "110"}
        body = client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels=labels, annotations={"kwok.x-k8s.io/node": "fake"}),
            spec=client.V1NodeSpec(taints=[client.V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")]
                                   if is_gpu else None),
            status=client.V1NodeStatus(capacity=cap, allocatable=cap))
        try:
            core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        if is_gpu:
            gcap = {**cap, "nvidia.com/gpu": "1"}
            core.patch_node_status(name, {"status": {"capacity": gcap, "allocatable": gcap}})
    wait(lambda: sum(1 for nd in core.list_node(label_selector="rl-scale=1").items
                     if any(c.type == "Ready" and c.status == "True" for c in nd.status.conditions or [])) >= n,
         f"{n} fake nodes Ready", 300)
    return cpu_nodes, gpu_nodes


def wait(pred, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"k8s_scale: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def render(helm: str, rollout: int, learners: int) -> str:
    sets = {"rayCluster.enabled": "true", "networkPolicy.enabled": "false", "podDisruptionBudget.enabled": "false",
            "monitoring.enabled": "false",
            "workerGroups.rollout-cpu.replicas": rollout, "workerGroups.rollout-cpu.minReplicas": rollout,
            "workerGroups.rollout-cpu.maxReplicas": rollout, "workerGroups.rollout-cpu.cpus": 2,
            "workerGroups.rollout-cpu.memory": "4Gi",
            "workerGroups.learner-gpu.enabled": "true", "workerGroups.learner-gpu.replicas": learners,
            "workerGroups.learner-gpu.minReplicas": learners, "workerGroups.learner-gpu.maxReplicas": learners}
    args = [helm, "template", "scale", str(REPO / "charts" / "rl-platform"), "--namespace", NS]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def run_size(api, helm: str, n: int) -> dict:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    cpu_nodes, gpu_nodes = make_nodes(core, n)
    # Three 2-CPU rollout workers per 8-CPU node (the head takes room on one), one learner per GPU node.
    rollout, learners = 3 * len(cpu_nodes), len(gpu_nodes)
    docs = {d["kind"]: d for d in yaml.safe_load_all(render(helm, rollout, learners)) if d}
    assert set(docs) == {"RayCluster", "ServiceAccount"}, f"k8s_scale: unexpected objects rendered: {sorted(docs)}"
    try:  # the RayCluster's pods run as the chart's ServiceAccount
        core.create_namespaced_service_account(NS, docs["ServiceAccount"])
    except ApiException as e:
        if e.status != 409:
            raise
    rc = docs["RayCluster"]
    name = rc["metadata"]["name"]
    t0 = time.monotonic()
    custom.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)
    want = 1 + rollout + learners

    def scheduled() -> bool:
        pods = core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={name}").items
        return len(pods) >= want and all(p.spec.node_name for p in pods)

    wait(scheduled, f"{want} pods scheduled", 1800)
    secs = time.monotonic() - t0
    pools = {nd.metadata.name: nd.metadata.labels.get("rl-platform.io/pool") for nd in core.list_node().items}
    wrong = []
    for p in core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={name}").items:
        group, pool = p.metadata.labels.get("ray.io/group"), pools.get(p.spec.node_name)
        ok = (group == "rollout-cpu" and pool == "cpu") or (group == "learner-gpu" and pool == "gpu") or \
             (p.metadata.labels.get("ray.io/node-type") == "head" and pool != "gpu")
        if not ok:
            wrong.append(f"{p.metadata.name}:{group}->{p.spec.node_name}")
    custom.delete_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", name)
    wait(lambda: not core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={name}").items, "pods deleted", 900)
    core.delete_collection_node(label_selector="rl-scale=1")
    wait(lambda: not core.list_node(label_selector="rl-scale=1").items, "nodes deleted", 300)
    return {"nodes": n, "cpu_nodes": len(cpu_nodes), "gpu_nodes": len(gpu_nodes), "pods": want,
            "apply_to_all_scheduled_s": round(secs, 1), "pods_per_s": round(want / secs, 1), "misplaced": wrong}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,500")
    args = ap.parse_args()
    helm = tool_env()["HELM"]
    api = config.new_client_from_config(config_file=kubeconfig())
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    except ApiException as e:
        if e.status != 409:
            raise
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        r = run_size(api, helm, n)
        print(f"{r['nodes']:>4} nodes  {r['pods']:>5} pods  apply->all scheduled {r['apply_to_all_scheduled_s']:>7.1f}s"
              f"  ({r['pods_per_s']} pods/s)  misplaced {len(r['misplaced'])}", flush=True)
        results.append(r)
    out = REPO / "bench" / "results" / "k8s_scale.json"
    out.write_text(json.dumps({"machine": platform.node(), "cpus": __import__("os").cpu_count(), "results": results},
                              indent=2) + "\n")
    print(f"wrote {out}")
    if any(r["misplaced"] for r in results):
        raise SystemExit("k8s_scale: some pods landed outside their pool (see the JSON)")


if __name__ == "__main__":
    main()
