"""Helpers for the chart tests (imported by the test modules; fixtures are in conftest.py): tool discovery (hack/tools.sh env), helm rendering and kubeconform.

The tools are built by `make tools` into a cache outside the repo. When one is missing the tests FAIL under CI=true
(CI must build them) and are skipped with a reason elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rl-platform"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
K8S_VALUES = ROOT / "k8s" / "values"
# Values files that are overlays, installed on top of a base file (hack/deploy-cluster.sh: kind.yaml + local.yaml).
K8S_OVERLAYS = {"local.yaml": "kind.yaml"}


def k8s_values_stack(path: Path) -> list[Path]:
    """The -f files a k8s/values file is installed with: its base first when it is an overlay."""
    base = K8S_OVERLAYS.get(path.name)
    return [K8S_VALUES / base, path] if base else [path]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def versions() -> dict[str, str]:
    """NAME := value lines of mk/versions.mk, the one place versions are written down."""
    out = {}
    for line in (ROOT / "mk" / "versions.mk").read_text().splitlines():
        m = re.match(r"^([A-Z0-9_]+)\s*:=\s*(\S.*?)\s*$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


_BUILT: set[str] = set()


def tool_env(*need: str) -> dict[str, str]:
    """NAME=path of the tools (`hack/tools.sh env`), once `need` (hack/tools.sh targets; default `all`, the chart
    tools) is built. `make test` builds them in the background while other suites run: hack/tools.sh waits for that
    build (or builds what is missing) and returns at once when the cache holds them. A build that fails leaves its
    tool missing, which the caller reports by name (`missing`); its output is printed with the test's."""
    todo = [t for t in (need or ("all",)) if t not in _BUILT]
    if todo:
        build = subprocess.run([str(ROOT / "hack" / "tools.sh"), *todo], capture_output=True, text=True)
        if build.returncode == 0:
            _BUILT.update(todo)
        else:
            print(f"hack/tools.sh {' '.join(todo)} failed (exit {build.returncode}):\n{build.stderr[-3000:]}")
    out = subprocess.run([str(ROOT / "hack" / "tools.sh"), "env"], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def missing(what: str) -> None:
    msg = f"{what} is missing: run `make tools` (hack/tools.sh builds it into ${{RLP_CACHE}}/tools)"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


class Tools:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.kube_version = env["KUBE_VERSION"]
        self._renders: dict[tuple, subprocess.CompletedProcess] = {}

    def path(self, key: str) -> str:
        p = self.env.get(key, "")
        if not p or not os.path.exists(p):
            missing(f"{key} ({p or 'unset'})")
        return p

    # -- helm ---------------------------------------------------------------------------------------------------
    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.path("HELM"), *args], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def template(self, *values: Path, sets: dict | None = None, release: str = "rlp", chart: Path = CHART,
                 check: bool = True) -> subprocess.CompletedProcess:
        # Renderings are memoised for the session: many tests look at the same install case.
        key = (tuple(map(str, values)), json.dumps(sets, sort_keys=True), release, str(chart))
        if key not in self._renders:
            self._renders[key] = self._template(*values, sets=sets, release=release, chart=chart)
        proc = self._renders[key]
        if check and proc.returncode != 0:
            raise AssertionError(f"helm template failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def _template(self, *values: Path, sets: dict | None, release: str, chart: Path) -> subprocess.CompletedProcess:
        args = ["template", release, str(chart), "--namespace", "rl", "--kube-version", self.kube_version]
        for v in values:
            args += ["-f", str(v)]
        for k, v in (sets or {}).items():
            args += ["--set-json", f"{k}={json.dumps(v)}"]
        return self.helm(*args, check=False)

    def render(self, *values: Path, sets: dict | None = None) -> list[dict]:
        return [d for d in yaml.safe_load_all(self.template(*values, sets=sets).stdout) if d]

    # -- kubeconform --------------------------------------------------------------------------------------------
    def kubeconform(self, *paths: str, stdin: str | None = None) -> tuple[int, list[dict], str]:
        """kubeconform -strict against Kubernetes + KubeRay + prometheus-operator + Kueue schemas, all offline."""
        schemas = [
            self.path("K8S_SCHEMAS")
            + "/{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json",
            self.path("KUBERAY_SCHEMAS") + "/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json",
            self.path("PROMETHEUS_OPERATOR_SCHEMAS") + "/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json",
            self.path("KUEUE_SCHEMAS") + "/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json",
        ]
        args = [self.path("KUBECONFORM"), "-strict", "-summary", "-output", "json", "-verbose",
                "-kubernetes-version", self.kube_version]
        for s in schemas:
            args += ["-schema-location", s]
        proc = subprocess.run([*args, *(paths or ["-"])], input=stdin, capture_output=True, text=True)
        try:
            resources = json.loads(proc.stdout).get("resources", [])
        except json.JSONDecodeError:
            resources = []
        return proc.returncode, resources, proc.stdout + proc.stderr

    def pod_security(self, pods: list[tuple[str, dict, dict]], level: str = "restricted") -> tuple[int, list[dict], str]:
        """Evaluate (name, metadata, spec) pod templates with the upstream Pod Security admission checks
        (hack/pod-security-check) at the Kubernetes version we render for."""
        major, minor = self.kube_version.split(".")[:2]
        payload = json.dumps([{"name": n, "metadata": m, "spec": s} for n, m, s in pods])
        proc = subprocess.run([self.path("POD_SECURITY_CHECK"), level, f"v{major}.{minor}"], input=payload,
                              capture_output=True, text=True)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.returncode, json.loads(proc.stdout), proc.stderr

    def promtool(self) -> str:
        p = shutil.which("promtool") or self.env.get("PROMTOOL", "")
        if not p or not os.path.exists(p):
            missing("promtool")
        return p


def pod_templates_with_metadata(doc: dict) -> list[tuple[str, dict, dict]]:
    """(where, template metadata, template spec) of every pod a KubeRay object makes, incl. the RayJob submitter."""
    kind, spec = doc.get("kind"), doc.get("spec", {})
    cluster_specs = []
    if kind == "RayCluster":
        cluster_specs.append(("spec", spec))
    elif kind == "RayJob" and "rayClusterSpec" in spec:
        cluster_specs.append(("spec.rayClusterSpec", spec["rayClusterSpec"]))
    elif kind == "RayService":
        cluster_specs.append(("spec.rayClusterConfig", spec["rayClusterConfig"]))
    out = []
    for where, cs in cluster_specs:
        head = cs["headGroupSpec"]["template"]
        out.append((f"{kind}/{where}.headGroupSpec", head.get("metadata", {}), head["spec"]))
        for g in cs.get("workerGroupSpecs", []):
            out.append((f"{kind}/{where}.workerGroupSpecs[{g['groupName']}]", g["template"].get("metadata", {}),
                        g["template"]["spec"]))
    if kind == "RayJob" and "submitterPodTemplate" in spec:
        t = spec["submitterPodTemplate"]
        out.append(("RayJob/spec.submitterPodTemplate", t.get("metadata", {}), t["spec"]))
    return out


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """(where, pod template spec) of every pod a KubeRay object makes, incl. the RayJob submitter."""
    return [(w, s) for w, _, s in pod_templates_with_metadata(doc)]
