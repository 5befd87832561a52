"""Versions are written down once (mk/versions.mk); everything else must agree with it."""

import re
import subprocess

import pytest
import yaml

from chartkit import CHART, ROOT, versions

pytestmark = pytest.mark.chart


def test_kuberay_version_is_pinned_once_and_the_chart_agrees():
    v = versions()
    assert v["KUBERAY_VERSION"] == "1.7.0"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["rl-platform.io/kuberay-version"] == v["KUBERAY_VERSION"]
    assert chart["annotations"]["rl-platform.io/ray-version"] == v["RAY_VERSION"]


def test_values_match_the_pinned_images_and_ray():
    v = versions()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["ray"]["version"] == v["RAY_VERSION"]
    assert f"{values['image']['cpu']['repository']}:{values['image']['cpu']['tag']}" == v["IMAGE_CPU"]
    assert f"{values['image']['gpu']['repository']}:{values['image']['gpu']['tag']}" == v["IMAGE_GPU"]
    assert values["image"]["pullPolicy"] == "IfNotPresent"


def test_no_other_file_hardcodes_the_kuberay_version():
    v = versions()["KUBERAY_VERSION"]
    offenders = []
    for path in [*(ROOT / "hack").glob("*.sh"), *(ROOT / "mk").glob("*.mk"), *(CHART / "templates").rglob("*"),
                 ROOT / "charts/rl-platform/values.yaml"]:
        if path.name == "versions.mk" or not path.is_file():
            continue
        if re.search(rf"\bv?{re.escape(v)}\b", path.read_text()):
            offenders.append(path.relative_to(ROOT).as_posix())
    assert offenders == []


def test_tools_live_in_a_versioned_cache_outside_the_repo(tools):
    v = versions()
    env = tools.env
    assert env["HELM"].endswith(f"/tools/helm-{v['HELM_VERSION']}/bin/helm")
    assert f"/tools/kubeconform-{v['KUBECONFORM_VERSION']}/" in env["KUBECONFORM"]
    assert f"/tools/helm-unittest-{v['HELM_UNITTEST_VERSION']}-" in env["HELM_UNITTEST"]
    assert f"/tools/prometheus-operator-{v['PROMETHEUS_OPERATOR_VERSION']}/" in env["PROMETHEUS_OPERATOR_SCHEMAS"]
    for key in ("HELM", "KUBECONFORM", "HELM_UNITTEST", "K8S_SCHEMAS"):
        assert not env[key].startswith(str(ROOT) + "/"), key
    out = subprocess.run([tools.path("HELM"), "version", "--short"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"v{v['HELM_VERSION']}")


def test_kuberay_schemas_come_from_the_pinned_version_or_the_declared_fallback(tools):
    v = versions()
    version_file = tools.path("KUBERAY_SCHEMAS").rsplit("/", 1)[0] + "/VERSION"
    got = open(version_file).read().strip()
    assert got in (v["KUBERAY_VERSION"], v.get("KUBERAY_CRD_FALLBACK_VERSION"))
