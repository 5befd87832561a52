"""`rl-submit [options] [hydra overrides]` / `python -m rl_submit`: run a trainer experiment on Kubernetes as a
KubeRay RayJob, with the same Hydra overrides `python -m trainer` takes. A Kubernetes client, not the trainer: it
only composes and checks the trainer's configs (trainer.config, trainer.validate, trainer.capacity), it never trains.

One concern per step, each a unit a test can hold alone:
  compose  the overrides become the RayJob's trainer command; that exact command is composed and validated here with
           the trainer's own Hydra configs and checks, so a bad config fails before anything exists on the cluster
  render   the RayJob comes from the chart (`helm template --show-only templates/rayjob.yaml`): the chart stays the
           one source of cluster shape; nothing here writes a pod spec
  fit      RLlib's resource request for that config (trainer.capacity.request) is placed on the nodes the rendered
           RayCluster may have (rl_submit.shape): a job its cluster can never hold is refused now, not after the trainer waited for nodes
  queue    with --queue, the Kueue LocalQueue, priority class and ClusterQueue must exist and the queue's quota must
           be able to hold the whole job (rl_submit.queue): a job that would wait for ever is refused
  submit   the `kubernetes` client creates it (kubeconfig context and namespace like kubectl, in-cluster in a pod)
  watch    RayJob status, its pods and warning events, and the submitter pod's log until a terminal state; a queued
           job's place and Kueue's reason while it waits (suspended, no pods)

Exit codes (the trainer's for a bad config, then the job's):
  0 SUCCEEDED  1 Hydra could not compose the overrides  2 a config value is invalid, or its cluster can never hold it
  3 could not submit, or the job cannot start (cluster unreachable, no KubeRay, RBAC, quota, namespace, image)
  4 FAILED  5 STOPPED (or deleted)  6 --timeout passed while the job still runs  130 Ctrl-C (the job keeps running)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

EXIT_SUCCEEDED, EXIT_COMPOSE, EXIT_INVALID, EXIT_NOT_SUBMITTED = 0, 1, 2, 3
EXIT_FAILED, EXIT_STOPPED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 4, 5, 6, 130
RAY = ("ray.io", "v1")
# KubeRay rejects longer RayJob names (MaxRayJobNameLength: its RayCluster and Service names append suffixes).
MAX_NAME = 47
REPO = Path(__file__).resolve().parents[1]
CONNECT_S, READ_S = 5, 30
# Waiting reasons a kubelet reports when a container image cannot be used; none of them resolves by waiting.
IMAGE_REASONS = {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"}


class Problem(Exception):
    """Something the user can fix; printed as one line `error: ...`, exit code `code`."""

    def __init__(self, message: str, code: int = EXIT_NOT_SUBMITTED):
        super().__init__(message)
        self.code = code


class NotFound(Problem):
    """The API answered 404 for the object or API asked for (not for a missing namespace)."""


# -- compose -----------------------------------------------------------------------------------------------------
def split_overrides(overrides: list[str]) -> tuple[str | None, str | None, list[str]]:
    """-> (experiment, output_dir, the rest): the chart writes `experiment=` and `output_dir=` itself."""
    experiment = output_dir = None
    rest = []
    for o in overrides:
        if o.startswith("experiment="):
            experiment = o.split("=", 1)[1]
        elif o.startswith("output_dir="):
            output_dir = o.split("=", 1)[1]
        else:
            rest.append(o)
    return experiment, output_dir, rest


def shell_word(override: str) -> str:
    """`key=value` with the value quoted for the submitter's shell when it needs it (`a=[1,2]` -> `a='[1,2]'`)."""
    key, eq, value = override.partition("=")
    if any(c.isspace() for c in override):
        raise Problem(f"override {override!r} contains whitespace, which the RayJob entrypoint cannot carry "
                      "(write lists without spaces: a=[1,2])", EXIT_INVALID)
    return f"{key}{eq}{shlex.quote(value)}" if eq and value else override


def trainer_args(rayjob: dict) -> list[str]:
    """The Hydra overrides of the rendered entrypoint, as the submitter's shell will pass them to the trainer."""
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    if argv[:3] != ["python", "-m", "trainer"]:
        raise Problem(f"the chart's RayJob entrypoint does not run the trainer: {rayjob['spec']['entrypoint']!r}")
    return argv[3:]


def compose_and_validate(overrides: list[str]):
    """Compose with the trainer's configs and check with trainer.validate; errors print as the trainer prints them."""
    from hydra import compose, initialize_config_module
    from hydra.errors import CompactHydraException, HydraException
    from omegaconf.errors import OmegaConfBaseException

    from trainer.config import register_configs
    from trainer.errors import TrainerError
    from trainer.validate import validate

    register_configs()
    try:
        with initialize_config_module(config_module="hydra_conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        text = str(e)
        if isinstance(e, CompactHydraException) and isinstance(e.__cause__, OmegaConfBaseException):
            text += "\n" + str(e.__cause__)
        raise Problem(text, EXIT_COMPOSE) from e
    try:
        validate(cfg)
    except TrainerError as e:
        raise Problem(str(e), EXIT_INVALID) from e
    return cfg


# -- render ------------------------------------------------------------------------------------------------------
def dns1035(text: str) -> str:
    """Lowercase letters, digits and '-', no leading/trailing/double '-' (what Kubernetes and KubeRay accept)."""
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower())).strip("-")


def job_suffix(experiment: str, budget: int, rand: str | None = None) -> str:
    """`<experiment>-<5 random>` cut to `budget` characters: unique per submission, readable in `kubectl get`."""
    rand = rand or "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(5))
    head = dns1035(experiment)[: max(budget - len(rand) - 1, 0)].rstrip("-")
    return f"{head}-{rand}" if head else rand[:budget]


def find_helm(explicit: str | None) -> str:
    """--helm, $HELM, the version pinned in mk/versions.mk (`make tools`), then `helm` on PATH."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise Problem(f"helm not found at {explicit} (--helm)")
        return explicit
    candidates = [os.environ.get("HELM")]
    tools = REPO / "hack" / "tools.sh"
    if tools.exists() and not os.environ.get("HELM"):
        env = subprocess.run([str(tools), "env"], capture_output=True, text=True).stdout
        candidates += [line.split("=", 1)[1] for line in env.splitlines() if line.startswith("HELM=")]
    candidates.append(shutil.which("helm"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise Problem("helm not found: pass --helm PATH, set HELM, or run `make tools` in the rl-platform repo")


def find_chart(explicit: str | None) -> str:
    chart = explicit or os.environ.get("RL_PLATFORM_CHART") or str(REPO / "charts" / "rl-platform")
    if "://" not in chart and not Path(chart).exists():
        raise Problem(f"chart not found at {chart}: pass --chart (the rl-platform repo's charts/rl-platform, a "
                      "packaged .tgz or an oci:// reference) or set RL_PLATFORM_CHART")
    return chart


@dataclass
class Renderer:
    """`helm template` of the chart's RayJob with the user's values files and `--set`s."""

    helm: str
    chart: str
    release: str
    namespace: str
    values: list[str] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    existing_cluster: bool = False
    job_values: dict[str, Any] = field(default_factory=dict)  # rayJob.* from flags (queue, priorityClass)

    def _template(self, template: str, sets: dict[str, Any], what: str) -> list[dict]:
        cmd = [self.helm, "template", self.release, self.chart, "--namespace", self.namespace, "--show-only", template]
        for v in self.values:
            cmd += ["-f", v]
        for s in self.sets:
            cmd += ["--set", s]
        for key, value in sets.items():
            cmd += ["--set-json", f"{key}={json.dumps(value)}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = proc.stderr.splitlines()
            schema = [line[2:] for line in lines if line.startswith("- at ")]  # values.schema.json violations
            why = "; ".join(schema) or next((line for line in lines if line.startswith("Error:")), proc.stderr.strip())
            why = re.sub(r"^Error: (execution error at \([^)]*\): )?", "", why)
            raise Problem(f"the chart cannot render {what}: {why}", EXIT_INVALID)
        return [d for d in yaml.safe_load_all(proc.stdout) if d]

    def render(self, **job: Any) -> dict:
        job = {"enabled": True, **self.job_values, **job}
        sets = {"rayCluster.enabled": True} if self.existing_cluster else {}
        if self.existing_cluster:
            job["useExistingCluster"] = True
        docs = self._template("templates/rayjob.yaml", {**sets, **{f"rayJob.{k}": v for k, v in job.items()}},
                              "this RayJob")
        if len(docs) != 1 or docs[0].get("kind") != "RayJob":
            raise Problem(f"the chart rendered no single RayJob from {self.chart} (rayJob.enabled?)")
        return docs[0]

    def values_overrides(self) -> list[str] | None:
        """`rayJob.overrides` as the values decide it (the chart's default, then each -f file: helm replaces lists),
        or None when a --set writes it (helm's --set syntax is not re-implemented here)."""
        if any(s.startswith("rayJob.overrides") for s in self.sets):
            return None
        proc = subprocess.run([self.helm, "show", "values", self.chart], capture_output=True, text=True)
        docs = [yaml.safe_load(proc.stdout) if proc.returncode == 0 else None]
        docs += [yaml.safe_load(Path(v).read_text()) for v in self.values if Path(v).is_file()]
        found: list[str] = []
        for d in docs:
            job = (d or {}).get("rayJob") or {}
            if isinstance(job, dict) and isinstance(job.get("overrides"), list):
                found = [str(o) for o in job["overrides"]]
        return found

    def render_cluster(self) -> dict:
        """The release's long-running RayCluster as these values render it (what --use-existing-cluster runs on)."""
        docs = self._template("templates/raycluster.yaml", {"rayCluster.enabled": True}, "the release's RayCluster")
        if len(docs) != 1 or docs[0].get("kind") != "RayCluster":
            raise Problem(f"the chart rendered no single RayCluster from {self.chart}")
        return docs[0]

    def describe(self) -> str:
        """The values that shape the cluster, as the user named them."""
        files = [os.path.relpath(v) if Path(v).is_absolute() and not os.path.relpath(v).startswith("..") else v
                 for v in self.values]
        return " ".join([*(f"-f {v}" for v in files), *(f"--set {s}" for s in self.sets)]) or "the chart's defaults"


FIXED = ("experiment=", "resources=", "output_dir=")  # what the chart's entrypoint writes before the overrides


def build_rayjob(r: Renderer, overrides: list[str], name: str | None, cluster: str | None) -> tuple[dict, Any, str]:
    """Render the RayJob for these overrides and validate the trainer command it will run.
    -> (rayjob, the composed config, output_dir)."""
    if name is not None and (not name or dns1035(name) != name):
        raise Problem(f"--name {name!r}: use lowercase letters, digits and '-' (a DNS-1035 label)", EXIT_INVALID)
    experiment, output_dir, rest = split_overrides(overrides)
    # `~experiment` (no preset): the chart always writes `experiment=X`, so remove exactly that one again.
    dropped = [o for o in rest if o == "~experiment" or o.startswith("~experiment=")]
    rest = [o for o in rest if o not in dropped]
    # A first render with the values alone gives what the chart and values decide: the name prefix, the
    # experiment, the results folder and the overrides tied to the cluster shape (the user's go after them).
    # The probe carries the user's overrides too: the chart checks them against the cluster shape (e.g. a values file
    # with no rollout group is fine with resources.num_env_runners=0 on the command line).
    from_values = r.values_overrides()
    tail = rest if from_values is not None else []
    probe = r.render(name="x", **({"overrides": [shell_word(o) for o in from_values + tail]}
                                  if from_values is not None else {}))
    prefix = probe["metadata"]["name"][:-1]
    base = trainer_args(probe)
    base = base[:len(base) - len(tail)]
    n_fixed = next((i for i, a in enumerate(base) if not a.startswith(FIXED)), len(base))
    base_experiment, base_output, _ = split_overrides(base[:n_fixed])
    experiment = experiment or base_experiment
    if dropped:
        rest.append(f"~experiment={experiment}")
    suffix = name or job_suffix("run" if dropped else experiment, MAX_NAME - len(prefix))
    # Each submission writes to its own folder named after the job unless output_dir= says where (e.g. to resume).
    output_dir = output_dir or f"{(base_output or '').rstrip('/')}/{prefix}{suffix}"
    job = r.render(name=suffix, experiment=experiment, outputDir=shlex.quote(output_dir),
                   overrides=[shell_word(o) for o in base[n_fixed:] + rest])
    if cluster:
        job["spec"]["clusterSelector"] = {"ray.io/cluster": cluster}
    args = trainer_args(job)
    if rest and args[-len(rest):] != rest:
        raise Problem(f"the chart's entrypoint does not pass the overrides through unchanged: {job['spec']['entrypoint']!r}")
    cfg = compose_and_validate(args)
    job["metadata"]["namespace"] = r.namespace
    return job, cfg, output_dir


# -- fit ---------------------------------------------------------------------------------------------------------
def check_fit(r: Renderer, rayjob: dict, cfg) -> None:
    """Refuse a job the nodes of its RayCluster (its own, or the release's it selects) can never hold."""
    from rl_submit.shape import cluster_specs, groups, misfit
    from trainer.capacity import request

    selected = (rayjob["spec"].get("clusterSelector") or {}).get("ray.io/cluster")
    if selected:
        cluster = r.render_cluster()
        if cluster["metadata"]["name"] != selected:
            return  # a RayCluster this chart release did not render (--cluster-selector): its shape is unknown here
        spec, where = cluster["spec"], f"RayCluster {selected}"
    else:
        ((_, spec),) = cluster_specs(rayjob)
        where = "its own RayCluster"
    why = misfit(request(cfg), groups(spec))
    if why:
        raise Problem(f"this job can never run on {where} ({r.describe()}): {why}", EXIT_INVALID)


# -- queue -------------------------------------------------------------------------------------------------------
def check_queue(kube: "Kube", rayjob: dict) -> None:
    """A queued job's LocalQueue and priority class exist, and its ClusterQueue can ever admit it (rl_submit.queue).
    Cluster-scoped objects a namespace user may not read (403) are left unchecked, saying so."""
    from rl_submit import queue as kq

    labels = rayjob["metadata"].get("labels") or {}
    name, priority = labels.get(kq.QUEUE_LABEL), labels.get(kq.PRIORITY_LABEL)
    if not name:
        return
    try:
        lq = call(kube, "get localqueues.kueue.x-k8s.io", kube.custom.get_namespaced_custom_object, *kq.KUEUE,
                  kube.namespace, "localqueues", name)
    except NotFound as p:
        raise Problem(f"no Kueue LocalQueue {name!r} in namespace {kube.namespace!r} (--queue; `kubectl get "
                      "localqueues`; the chart makes one with kueue.enabled=true)"
                      if "localqueues" in str(p) else f"Kueue is not installed on {kube.server}: {p}") from p

    def cluster_obj(plural: str, obj: str) -> dict | None:
        try:
            return call(kube, f"get {plural}.kueue.x-k8s.io", kube.custom.get_cluster_custom_object, *kq.KUEUE,
                        plural, obj)
        except NotFound:
            return None
        except Problem as p:
            if "forbidden" not in str(p):
                raise
            print(f"rl-submit: not checked against Kueue's {plural} (no read access): {p}", file=sys.stderr)
            return {}

    if priority and cluster_obj("workloadpriorityclasses", priority) is None:
        raise Problem(f"no Kueue WorkloadPriorityClass {priority!r} (--priority; `kubectl get "
                      "workloadpriorityclasses`)", EXIT_INVALID)
    cq_name = (lq.get("spec") or {}).get("clusterQueue")
    cq = cluster_obj("clusterqueues", cq_name)
    if cq is None:
        raise Problem(f"LocalQueue {name!r} feeds ClusterQueue {cq_name!r}, which does not exist: a job there would "
                      "wait for ever")
    if not cq or (cq.get("spec") or {}).get("cohortName"):
        return  # unreadable, or may borrow from its cohort: how much it could ever give is not known here
    flavors = {}
    for g in cq["spec"].get("resourceGroups") or []:
        for f in g.get("flavors") or []:
            obj = cluster_obj("resourceflavors", f["name"])
            if obj:
                flavors[f["name"]] = obj
    why = kq.never_admitted(kq.pod_sets(rayjob), cq, flavors)
    if why:
        raise Problem(f"this job can never be admitted from LocalQueue {name!r}: {why}", EXIT_INVALID)


def queued_line(kube: "Kube", rayjob: dict) -> str | None:
    """Where a suspended, queued RayJob stands in Kueue (rl_submit.queue.workload_line); None when it is not
    queued, not suspended, or its Workload is not readable (yet)."""
    from rl_submit import queue as kq

    labels = rayjob["metadata"].get("labels") or {}
    if not labels.get(kq.QUEUE_LABEL) or not rayjob["spec"].get("suspend"):
        return None
    uid = rayjob["metadata"].get("uid")
    try:
        mine = call(kube, "list workloads.kueue.x-k8s.io", kube.custom.list_namespaced_custom_object, *kq.KUEUE,
                    kube.namespace, "workloads", label_selector=f"{kq.JOB_UID_LABEL}={uid}")["items"]
        if not mine:
            return f"queued in LocalQueue {labels[kq.QUEUE_LABEL]}: waiting for Kueue to create its Workload"
        queue = (mine[0].get("spec") or {}).get("queueName")
        every = call(kube, "list workloads.kueue.x-k8s.io", kube.custom.list_namespaced_custom_object, *kq.KUEUE,
                     kube.namespace, "workloads")["items"]
    except Problem as p:
        return f"queued in LocalQueue {labels[kq.QUEUE_LABEL]} (its Workload is not readable: {p})"
    pending = [w for w in every if (w.get("spec") or {}).get("queueName") == queue
               and not any(c["type"] == "QuotaReserved" and c["status"] == "True"
                           for c in (w.get("status") or {}).get("conditions") or [])
               and not any(c["type"] == "Finished" and c["status"] == "True"
                           for c in (w.get("status") or {}).get("conditions") or [])]
    return kq.workload_line(mine[0], pending)


# -- submit ------------------------------------------------------------------------------------------------------
@dataclass
class Kube:
    """API clients for one kubeconfig context (or the pod's service account) and the namespace to work in."""

    api: client.ApiClient
    namespace: str
    server: str
    context: str

    def __post_init__(self):
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)


SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # in a pod: its token and namespace


def kube_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    """The namespace of the kubeconfig context, else of the pod we run in; None when neither names one."""
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except Exception:  # no kubeconfig
        return (SA_DIR / "namespace").read_text().strip() if (SA_DIR / "namespace").exists() else None
    ctx = next((c for c in contexts if c["name"] == context), None) if context else current
    return (ctx or {}).get("context", {}).get("namespace")


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Kube:
    """Credentials and namespace as kubectl picks them: --kubeconfig, $KUBECONFIG, ~/.kube/config, else in-cluster."""
    conf = client.Configuration()
    paths = [kubeconfig] if kubeconfig else os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)
    have_file = any(p and Path(p).expanduser().exists() for p in paths)
    try:
        if have_file:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=conf)
            ns = namespace or kube_namespace(kubeconfig, context) or "default"
            ctx = context or config.list_kube_config_contexts(config_file=kubeconfig)[1]["name"]
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and (SA_DIR / "token").exists() and not (kubeconfig or context):
            config.load_incluster_config(client_configuration=conf)
            ns = namespace or kube_namespace(None, None) or "default"
            ctx = "in-cluster"
        else:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise Problem(f"no kubeconfig: {where} does not exist and this is not a pod "
                          "(pass --kubeconfig, set KUBECONFIG, or run `make deploy-cluster`)")
    except ConfigException as e:
        raise Problem(f"kubeconfig: {e}") from e
    conf.retries = 0  # fail fast and clearly rather than retry an unreachable server
    return Kube(client.ApiClient(conf), ns, conf.host, ctx)


def api_body(e) -> dict:
    body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else (e.body or "")
    try:
        return json.loads(body) if body.startswith("{") else {"message": body.strip() or e.reason}
    except ValueError:
        return {"message": body.strip()}


def explain(e: Exception, kube: Kube, doing: str) -> Problem:
    """One line for an API or connection error while `doing` something (e.g. 'create rayjobs.ray.io')."""
    if isinstance(e, ApiException):
        body = api_body(e)
        msg = body.get("message") or e.reason or ""
        if e.status == 401:
            return Problem(f"the API server at {kube.server} rejected the credentials of context {kube.context!r} (401 Unauthorized)")
        if e.status == 403 and "exceeded quota" in msg:
            return Problem(f"quota exceeded in namespace {kube.namespace!r}: {msg}")
        if e.status == 403:
            return Problem(f"forbidden by RBAC, cannot {doing} in namespace {kube.namespace!r}: {msg}")
        if e.status == 404 and (body.get("details") or {}).get("kind") == "namespaces":
            return Problem(f"namespace {kube.namespace!r} does not exist (pass --namespace/-n or create it)")
        if e.status == 404:
            return NotFound(f"cannot {doing}: {msg}")
        if e.status == 409:
            return Problem(f"{msg} in namespace {kube.namespace!r} (choose another --name, or `rl-submit stop` it)")
        return Problem(f"cannot {doing}: {e.status} {msg}")
    if isinstance(e, (HTTPError, OSError)):
        reason = getattr(e, "reason", None) or e
        return Problem(f"cannot reach the Kubernetes API at {kube.server}: {_short(reason)}")
    return Problem(f"cannot {doing}: {e}")


def _short(reason: Any) -> str:
    text = str(reason)
    for known in ("Connection refused", "timed out", "Name or service not known", "No route to host",
                  "certificate verify failed", "Network is unreachable"):
        if known.lower() in text.lower():
            return known.lower()
    return text.split(": ")[-1][:200]


def call(kube: Kube, doing: str, fn, *args, **kw):
    """An API call with bounded connect/read timeouts; every failure becomes a Problem naming what was tried."""
    kw.setdefault("_request_timeout", (CONNECT_S, READ_S))
    try:
        return fn(*args, **kw)
    except Problem:
        raise
    except Exception as e:
        raise explain(e, kube, doing) from e


def check_kuberay(kube: Kube) -> None:
    """The ray.io/v1 API with rayjobs must be served (a cluster-wide fact, read through discovery)."""
    try:
        res = call(kube, "read the ray.io/v1 API", kube.custom.get_api_resources, *RAY)
    except NotFound as p:
        raise Problem(f"KubeRay is not installed on {kube.server}: the API server serves no ray.io/v1 "
                      "(install the kuberay-operator chart, or `make deploy-cluster`)") from p
    if "rayjobs" not in {r.name for r in res.resources}:
        raise Problem(f"the KubeRay CRDs on {kube.server} have no RayJob (ray.io/v1 rayjobs): upgrade KubeRay")


def get(kube: Kube, plural: str, name: str) -> dict:
    try:
        return call(kube, f"get {plural}.ray.io", kube.custom.get_namespaced_custom_object, *RAY, kube.namespace,
                    plural, name)
    except NotFound as p:
        kind = {"rayjobs": "RayJob", "rayclusters": "RayCluster"}[plural]
        raise NotFound(f"no {kind} {name!r} in namespace {kube.namespace!r}") from p


def submit(kube: Kube, rayjob: dict) -> None:
    check_kuberay(kube)
    check_queue(kube, rayjob)
    cluster = (rayjob["spec"].get("clusterSelector") or {}).get("ray.io/cluster")
    if cluster:  # else the RayJob would wait for a cluster that never comes
        try:
            get(kube, "rayclusters", cluster)
        except NotFound as p:
            raise Problem(f"{p} to submit to (deploy the chart's RayCluster, or drop "
                          "--use-existing-cluster/--cluster-selector)") from p
    call(kube, "create rayjobs.ray.io", kube.custom.create_namespaced_custom_object, *RAY, kube.namespace,
         "rayjobs", rayjob)


# -- watch -------------------------------------------------------------------------------------------------------
def image_problem(pod) -> str | None:
    """The kubelet's reason when a container of `pod` cannot get its image, as one line; None when there is none."""
    statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
    for cs in statuses:
        w = cs.state.waiting if cs.state else None
        if w and w.reason in IMAGE_REASONS:
            return (f"image {cs.image} cannot be used by pod {pod.metadata.name} on node {pod.spec.node_name}: "
                    f"{w.reason}{': ' + w.message if w.message else ''}")
    return None


def outcome(status: dict, queued: bool = False) -> int | None:
    """Exit code for a terminal RayJob status; None while it is still going. A queued job (Kueue) is Suspended while
    it waits for admission or after a preemption: not an end."""
    dep, job = status.get("jobDeploymentStatus"), status.get("jobStatus")
    if dep == "ValidationFailed":
        return EXIT_NOT_SUBMITTED
    if dep in ("Complete", "Failed") or (dep == "Suspended" and not queued):
        if job == "SUCCEEDED" and dep == "Complete":
            return EXIT_SUCCEEDED
        return EXIT_STOPPED if job == "STOPPED" or dep == "Suspended" else EXIT_FAILED
    return None


class LogFollower(threading.Thread):
    """Streams one pod's log to stdout until the container ends (the submitter's is `ray job logs --follow`)."""

    def __init__(self, kube: Kube, pod: str, note):
        super().__init__(daemon=True)
        self.kube, self.pod, self.note = kube, pod, note
        self.retry = False

    def run(self) -> None:
        try:
            resp = self.kube.core.read_namespaced_pod_log(self.pod, self.kube.namespace, follow=True,
                                                          _preload_content=False, _request_timeout=(CONNECT_S, None))
            for chunk in resp.stream(4096):
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        except ApiException as e:
            msg = api_body(e).get("message") or e.reason
            if e.status == 400 and ("waiting to start" in msg or "ContainerCreating" in msg):
                self.retry = True  # not started yet: the watch tries again
            else:
                self.note(f"logs of pod {self.pod} unavailable: {msg}")
        except Exception as e:  # the stream broke (network): the status watch goes on
            self.note(f"log stream of pod {self.pod} ended: {_short(e)}")


@dataclass
class Watch:
    """Follows one RayJob: prints state changes (stderr) and the submitter's log (stdout), returns an exit code."""

    kube: Kube
    name: str
    poll_s: float = 2.0
    started: float = field(default_factory=time.monotonic)
    marks: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)
    _said: set = field(default_factory=set)
    _logs: dict = field(default_factory=dict)
    _denied: set = field(default_factory=set)

    def say(self, msg: str, once: bool = False) -> None:
        if once and msg in self._said:
            return
        self._said.add(msg)
        print(f"rl-submit [{time.monotonic() - self.started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def mark(self, what: str, msg: str | None = None) -> None:
        """Seconds from creation to the first time `what` was seen (the timeline in the summary)."""
        if what not in self.marks:
            self.marks[what] = round(time.monotonic() - self.started, 1)
            if msg:
                self.say(msg)

    def run(self, timeout_s: float) -> int:
        last = None
        while True:
            try:
                obj = get(self.kube, "rayjobs", self.name)
            except NotFound:
                self.say(f"RayJob {self.name} was deleted")
                return EXIT_STOPPED
            st = self.status = obj.get("status") or {}
            now = (st.get("jobDeploymentStatus") or "New", st.get("jobStatus") or "-")
            if now != last:
                self.say(f"RayJob {now[0]}, Ray job {now[1]}" + (f": {st['message']}" if st.get("message") else ""))
                last = now
            queued = bool((obj["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name"))
            waiting = queued_line(self.kube, obj) if queued else None
            if waiting:
                self.mark("queued")
                self.say(waiting, once=True)
            elif queued and obj["spec"].get("suspend") is False and "queued" in self.marks:
                self.mark("admitted", "admitted by Kueue: unsuspended")
            cluster, selected = st.get("rayClusterName"), bool(obj["spec"].get("clusterSelector"))
            if cluster and not waiting:
                self.mark("raycluster", f"{'runs on' if selected else 'created'} RayCluster {cluster}")
                self.check_ray_pods(cluster)
            self.check_submitter()
            # A selected cluster is shared: its events are not this job's.
            self.check_events(self.name if selected or not cluster else (self.name, cluster))
            code = outcome(st, queued)
            if code is not None:
                self.mark("terminal")
                for t in self._logs.values():
                    t.join(timeout=10)
                return code
            if time.monotonic() - self.started > timeout_s:
                self.say(f"still {now[0]} after --timeout {timeout_s:.0f}s; the job keeps running")
                return EXIT_TIMEOUT
            # Quick polls while the cluster comes up (seconds), then every poll_s (a training run takes minutes).
            time.sleep(0.5 if time.monotonic() - self.started < 15 else self.poll_s)

    def _list(self, what: str, fn, **kw):
        """A read the watch can do without (RBAC may allow create but not list): note it once, go on."""
        if what in self._denied:
            return []
        try:
            return call(self.kube, f"list {what}", fn, self.kube.namespace, **kw).items
        except Problem as p:
            if "forbidden" not in str(p):
                raise
            self._denied.add(what)
            self.say(f"not watching {what}: {p}")
            return []

    def check_pods(self, selector: str, what: str) -> list:
        """Pods of the RayCluster or the submitter Job: fatal image problems, unschedulable ones said once."""
        pods = self._list("pods", self.kube.core.list_namespaced_pod, label_selector=selector)
        for p in pods:
            why = image_problem(p)
            if why:
                raise Problem(why)
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    self.say(f"{what} pod {p.metadata.name} cannot be scheduled yet: {c.message}", once=True)
        return pods

    def check_ray_pods(self, cluster: str) -> None:
        pods = self.check_pods(f"ray.io/cluster={cluster}", "Ray")
        up = sum(p.status.phase == "Running" for p in pods)
        if pods:
            self.say(f"Ray pods: {up}/{len(pods)} running", once=True)
            if up == len(pods):
                self.mark("ray_pods_running")

    def check_submitter(self) -> None:
        """The K8sJobMode submitter (`ray job submit` + `ray job logs --follow`): its phases and its log."""
        for p in self.check_pods(f"job-name={self.name}", "submitter"):
            phase = p.status.phase
            self.say(f"submitter pod {p.metadata.name} {phase}", once=True)
            if phase in ("Running", "Succeeded", "Failed"):
                self.mark("submitter_started")
                t = self._logs.get(p.metadata.name)
                if t is None or (t.retry and not t.is_alive()):
                    t = self._logs[p.metadata.name] = LogFollower(self.kube, p.metadata.name, self.say)
                    t.start()
            if phase in ("Succeeded", "Failed"):
                self.mark("submitter_finished")

    def check_events(self, ours: str | tuple) -> None:
        """Warning events of objects named `ours*` (the RayJob, its RayCluster, submitter Job and their pods);
        quota refusals are fatal."""
        for ev in self._list("events", self.kube.core.list_namespaced_event, field_selector="type=Warning"):
            if not (ev.involved_object.name or "").startswith(ours):
                continue
            msg = f"{ev.involved_object.kind} {ev.involved_object.name}: {ev.reason}: {ev.message}"
            if "exceeded quota" in (ev.message or ""):
                raise Problem(f"quota exceeded in namespace {self.kube.namespace!r}: {msg}")
            if ev.reason != "FailedScheduling":  # unschedulable pods are reported from their conditions
                self.say(f"warning: {msg}", once=True)


# -- commands ----------------------------------------------------------------------------------------------------
def follow_hint(kube: Kube, name: str, args) -> str:
    flags = f" -n {kube.namespace}" + (f" --context {args.context}" if args.context else "") + \
        (f" --kubeconfig {args.kubeconfig}" if args.kubeconfig else "")
    return (f"  rl-submit status {name}{flags}\n  rl-submit logs {name}{flags}\n  rl-submit stop {name}{flags}")


def cmd_submit(args) -> int:
    if args.values is None:
        default = REPO / "k8s" / "values" / "cartpole.yaml"
        args.values = [str(default)] if default.exists() else []
    namespace = args.namespace or kube_namespace(args.kubeconfig, args.context) or "default"
    job_values = {k: v for k, v in (("queue", args.queue), ("priorityClass", args.priority)) if v}
    renderer = Renderer(find_helm(args.helm), find_chart(args.chart), args.release, namespace, args.values,
                        args.set or [], existing_cluster=args.use_existing_cluster or bool(args.cluster_selector),
                        job_values=job_values)
    rayjob, cfg, output_dir = build_rayjob(renderer, args.overrides, args.name, args.cluster_selector)
    check_fit(renderer, rayjob, cfg)
    if args.dry_run:
        sys.stdout.write(yaml.safe_dump(rayjob, sort_keys=False, width=10**6))
        return EXIT_SUCCEEDED
    kube = connect(args.kubeconfig, args.context, args.namespace)
    name = rayjob["metadata"]["name"]
    rayjob["metadata"]["namespace"] = kube.namespace
    t0 = time.monotonic()
    submit(kube, rayjob)
    print(f"rl-submit: rayjob/{name} created in namespace {kube.namespace} (experiment {cfg.experiment}, "
          f"output_dir {output_dir})", file=sys.stderr, flush=True)
    if args.detach:
        print(f"follow or stop it with:\n{follow_hint(kube, name, args)}", file=sys.stderr)
        print(name)
        return EXIT_SUCCEEDED
    watch = Watch(kube, name, started=t0)
    try:
        code = watch.run(args.timeout)
    except KeyboardInterrupt:
        print(f"\nrl-submit: stopped watching; RayJob {name} keeps running. Follow or stop it with:\n"
              f"{follow_hint(kube, name, args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Problem as p:
        p.args = (f"{p} (RayJob {name} stays; `rl-submit stop {name} -n {kube.namespace}` removes it)",)
        raise
    st = watch.status
    print(json.dumps({"name": name, "namespace": kube.namespace, "experiment": cfg.experiment,
                      "output_dir": output_dir, "jobDeploymentStatus": st.get("jobDeploymentStatus"),
                      "jobStatus": st.get("jobStatus"), "reason": st.get("reason"), "message": st.get("message"),
                      "timeline_s": watch.marks}), flush=True)
    return code


def cmd_status(args) -> int:
    kube = connect(args.kubeconfig, args.context, args.namespace)
    obj = get_rayjob(kube, args.name)
    st = obj.get("status") or {}
    queued = bool((obj["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name"))
    waiting = queued_line(kube, obj) if queued else None
    if waiting:
        print(f"{args.name}: {waiting}")
        return EXIT_SUCCEEDED
    line = f"{args.name}: {st.get('jobDeploymentStatus') or 'New'}, Ray job {st.get('jobStatus') or '-'}"
    if st.get("rayClusterName"):
        pods = call(kube, "list pods", kube.core.list_namespaced_pod, kube.namespace,
                    label_selector=f"ray.io/cluster={st['rayClusterName']}").items
        up = sum(p.status.phase == "Running" for p in pods)
        line += f", RayCluster {st['rayClusterName']} ({up}/{len(pods)} pods running)"
    why = ": ".join(x for x in (st.get("reason"), st.get("message")) if x)
    line += f"; {why}" if why else ""
    print(line)
    code = outcome(st, queued)
    return EXIT_SUCCEEDED if code is None else code


def cmd_logs(args) -> int:
    kube = connect(args.kubeconfig, args.context, args.namespace)
    get_rayjob(kube, args.name)
    pods = call(kube, "list pods", kube.core.list_namespaced_pod, kube.namespace,
                label_selector=f"job-name={args.name}").items
    if not pods:
        raise Problem(f"RayJob {args.name} has no submitter pod yet (`rl-submit status {args.name}`)")
    pod = max(pods, key=lambda p: p.metadata.creation_timestamp).metadata.name
    if args.follow:
        t = LogFollower(kube, pod, lambda m: print(f"rl-submit: {m}", file=sys.stderr))
        t.run()
    else:
        sys.stdout.write(call(kube, f"read the log of pod {pod}", kube.core.read_namespaced_pod_log, pod, kube.namespace))
    return EXIT_SUCCEEDED


def cmd_stop(args) -> int:
    kube = connect(args.kubeconfig, args.context, args.namespace)
    if get_rayjob(kube, args.name)["metadata"].get("deletionTimestamp"):
        print(f"rl-submit: rayjob/{args.name} is already being deleted", file=sys.stderr)
        return EXIT_SUCCEEDED
    call(kube, "delete rayjobs.ray.io", kube.custom.delete_namespaced_custom_object, *RAY, kube.namespace,
         "rayjobs", args.name, propagation_policy="Background")
    print(f"rl-submit: rayjob/{args.name} deleted; KubeRay stops the Ray job and removes its RayCluster and "
          "submitter Job", file=sys.stderr)
    return EXIT_SUCCEEDED


def get_rayjob(kube: Kube, name: str) -> dict:
    check_kuberay(kube)
    return get(kube, "rayjobs", name)


# -- command line ------------------------------------------------------------------------------------------------
def _cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster in a pod)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's namespace, else default)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rl-submit", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a trainer experiment on Kubernetes as a KubeRay RayJob rendered from the rl-platform chart. "
                    "Takes the same Hydra overrides as `python -m trainer`.",
        epilog="also: rl-submit status|logs|stop NAME [-n NS] [--context CTX]\n\n" + __doc__.split("Exit codes", 1)[1]
        .replace(" (the trainer's for a bad config, then the job's):", "exit codes:"))
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=pong_ppo algo.lr=3e-4")
    _cluster_flags(p)
    p.add_argument("--dry-run", action="store_true",
                   help="check as for a submission, print the RayJob YAML and exit; touch no cluster")
    p.add_argument("--detach", action="store_true", help="return once the RayJob is created (prints its name)")
    p.add_argument("--timeout", type=float, default=86400, help="stop watching after SECONDS (exit 6; default 86400)")
    p.add_argument("--name", help="RayJob name suffix: the job is <release>-NAME (default: <experiment>-<random>)")
    p.add_argument("--values", "-f", action="append", metavar="FILE",
                   help="chart values file for the cluster shape, repeatable (default: k8s/values/cartpole.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="chart value, as helm --set, repeatable")
    p.add_argument("--use-existing-cluster", action="store_true",
                   help="run on the release's long-running RayCluster (clusterSelector) instead of a new one")
    p.add_argument("--cluster-selector", metavar="RAYCLUSTER",
                   help="run on this existing RayCluster (its shape is checked only when it is the release's)")
    p.add_argument("--queue", metavar="LOCALQUEUE",
                   help="wait in this Kueue LocalQueue until its quota admits the whole job (rayJob.queue); a job "
                        "the queue can never admit is refused")
    p.add_argument("--priority", metavar="CLASS",
                   help="Kueue WorkloadPriorityClass of a queued job (rayJob.priorityClass): admitted before lower "
                        "ones and may preempt them (they checkpoint and resume)")
    p.add_argument("--release", default="rl-platform", help="chart release the job belongs to (default: rl-platform)")
    p.add_argument("--chart", help="the rl-platform chart: a folder, .tgz or oci:// (default: the repo's "
                                   "charts/rl-platform, or $RL_PLATFORM_CHART)")
    p.add_argument("--helm", help="helm binary (default: $HELM, the repo's `make tools` build, helm on PATH)")
    return p


def sub_parser(cmd: str) -> argparse.ArgumentParser:
    what = {"status": "one line: RayJob and Ray job state, its RayCluster, the reason, or where a queued job stands "
                      "in Kueue (exit code as for a watch: "
                      "0 running or SUCCEEDED, 4 FAILED, 5 STOPPED)",
            "logs": "the submitter pod's log (the trainer's output)",
            "stop": "delete the RayJob: KubeRay stops the Ray job and removes its RayCluster"}[cmd]
    p = argparse.ArgumentParser(prog=f"rl-submit {cmd}", description=what)
    p.add_argument("name", help="RayJob name (as printed by rl-submit and `kubectl get rayjobs`)")
    _cluster_flags(p)
    if cmd == "logs":
        p.add_argument("-f", "--follow", action="store_true", help="stream until the submitter ends")
    return p


COMMANDS = {"status": cmd_status, "logs": cmd_logs, "stop": cmd_stop}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # A subcommand is a bare word (a Hydra override never is) that is not the value of an option: `-n ns stop X`.
    takes_value = {o for a in parser()._actions if a.nargs != 0 for o in a.option_strings}
    cmd = next((i for i, a in enumerate(argv) if a in COMMANDS and (i == 0 or argv[i - 1] not in takes_value)), None)
    try:
        if cmd is not None:
            return COMMANDS[argv[cmd]](sub_parser(argv[cmd]).parse_args(argv[:cmd] + argv[cmd + 1:]))
        if "-m" in argv or "--multirun" in argv:
            raise Problem("rl-submit runs one experiment per RayJob; for a sweep use tune=asha|hyperband|pbt",
                          EXIT_INVALID)
        return cmd_submit(parser().parse_intermixed_args(argv))
    except Problem as p:
        print(str(p) if p.code == EXIT_COMPOSE else f"error: {p}", file=sys.stderr, flush=True)
        return p.code
    except KeyboardInterrupt:
        print("rl-submit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

