"""Versions are written down once (mk/versions.mk); everything else must agree with it."""

import re
import subprocess

import pytest
import yaml

from chartkit import CHART, ROOT, versions

pytestmark = pytest.mark.chart


def test_kuberay_version_is_pinned_once_and_the_chart_agrees():
    """The chart declares the KubeRay release that is tested (KUBERAY_VERSION) and, apart, the one it targets next;
    the README states both. tests/k8s/test_0_cluster.py checks the operator the cluster tier runs is the declared one."""
    v = versions()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["rl-platform.io/kuberay-version"] == v["KUBERAY_VERSION"]
    assert chart["annotations"]["rl-platform.io/kuberay-target-version"] == v["KUBERAY_TARGET_VERSION"]
    assert chart["annotations"]["rl-platform.io/ray-version"] == v["RAY_VERSION"]
    readme = (CHART / "README.md").read_text()
    assert f"KubeRay operator **{v['KUBERAY_VERSION']}**" in readme
    assert f"--version {v['KUBERAY_VERSION']} " in readme
    assert f"{v['KUBERAY_TARGET_VERSION']} is the\ntarget" in readme or f"{v['KUBERAY_TARGET_VERSION']} is the target" in readme
    # No fallback any more: what is declared is what is built and run.
    assert "KUBERAY_CRD_FALLBACK_VERSION" not in v


def test_values_match_the_pinned_images_and_ray():
    v = versions()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["ray"]["version"] == v["RAY_VERSION"]
    assert f"{values['image']['cpu']['repository']}:{values['image']['cpu']['tag']}" == v["IMAGE_CPU"]
    redis = values["gcsFaultTolerance"]["redis"]["image"]
    assert f"{redis['repository']}:{redis['tag']}" == v["IMAGE_REDIS"]
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


def test_kuberay_schemas_come_from_the_pinned_version(tools):
    """The chart is validated against the CRDs of the KubeRay release it declares, not another one."""
    v = versions()
    version_file = tools.path("KUBERAY_SCHEMAS").rsplit("/", 1)[0] + "/VERSION"
    got = open(version_file).read().strip()
    assert got == v["KUBERAY_VERSION"], f"KubeRay CRD schemas of v{got}, the chart declares v{v['KUBERAY_VERSION']}"


def _tracked_text_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    for rel in out:
        path = ROOT / rel
        if path.is_file() and path.suffix not in (".png", ".tgz", ".gz", ".whl") and "/dashboards/" not in rel:
            try:
                yield rel, path.read_text()
            except UnicodeDecodeError:
                continue


def _image_version(tag: str) -> str:
    return tag.rsplit(":", 1)[1].rsplit("-", 1)[0]  # rl-platform:0.1.0-cpu -> 0.1.0


def test_copies_that_cannot_be_derived_agree_with_versions_mk():
    """pyproject and Chart.yaml cannot read mk/versions.mk: they keep copies, and this test is their drift check."""
    import tomllib

    v = versions()
    image_version = _image_version(v["IMAGE_CPU"])
    assert _image_version(v["IMAGE_GPU"]) == image_version == _image_version(v["IMAGE_REDIS"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == image_version
    ray_pins = [d for d in project["dependencies"] if re.match(r"ray(\[|==)", d)]
    assert ray_pins and all(d.endswith(f"=={v['RAY_VERSION']}") for d in ray_pins), ray_pins
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == image_version
    values_text = (CHART / "values.yaml").read_text()
    assert set(re.findall(r"\bRay (\d+\.\d+\.\d+)", values_text)) <= {v["RAY_VERSION"]}


def test_every_image_tag_and_ray_pin_in_the_repo_is_the_pinned_one():
    """Docs, generated manifests, helm-unittest suites and scripts may spell the tags; none may drift."""
    v = versions()
    tag = re.compile(r"\brl-platform:(\d[\w.]*)-(cpu|gpu|redis)\b")
    pin = re.compile(r"\bray(?:\[[a-z,]+\])?==(\d+\.\d+\.\d+)")
    offenders = []
    for rel, text in _tracked_text_files():
        if rel == "mk/versions.mk":
            continue
        for m in tag.finditer(text):
            if m.group(0) != v[f"IMAGE_{m.group(2).upper()}"]:
                offenders.append(f"{rel}: {m.group(0)}")
        for m in pin.finditer(text):
            if m.group(1) != v["RAY_VERSION"]:
                offenders.append(f"{rel}: {m.group(0)}")
    assert offenders == []


def test_dockerfiles_and_build_scripts_derive_the_image_version():
    """The image version is not written in the Dockerfiles, mk/images.mk or hack/images.sh: it comes from the tag."""
    image_version = _image_version(versions()["IMAGE_CPU"])
    for rel in ("Dockerfile.cpu", "Dockerfile.gpu", "docker/redis.Dockerfile", "mk/images.mk", "hack/images.sh"):
        text = (ROOT / rel).read_text()
        assert not re.search(rf"(?<![\d.]){re.escape(image_version)}(?![\d.])", text), rel
    for rel in ("Dockerfile.cpu", "Dockerfile.gpu", "docker/redis.Dockerfile"):
        assert 'org.opencontainers.image.version="${IMAGE_VERSION}"' in (ROOT / rel).read_text()
    assert '--build-arg "IMAGE_VERSION=$(image_version "${image}")"' in (ROOT / "hack/images.sh").read_text()
