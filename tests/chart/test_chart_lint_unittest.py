"""helm lint --strict for every ci/ install case, and the chart's helm-unittest suites."""

import re
import subprocess

import pytest
import yaml

from chartkit import CHART, CI_VALUES

pytestmark = pytest.mark.chart


def test_ci_values_cover_the_install_cases():
    names = {p.name for p in CI_VALUES}
    assert {"cpu-only-values.yaml", "gpu-learners-values.yaml", "autoscaling-values.yaml",
            "monitoring-on-values.yaml", "monitoring-off-values.yaml", "hostpath-storage-values.yaml"} <= names


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_helm_lint_strict(tools, values):
    proc = tools.helm("lint", "--strict", "--kube-version", tools.kube_version, str(CHART), "-f", str(values),
                      check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_helm_lint_strict_fails_on_a_broken_values_file(tools, tmp_path):
    bad = tmp_path / "bad-values.yaml"
    bad.write_text("workerGroups:\n  rollout-cpu:\n    replicas: -3\n")
    proc = tools.helm("lint", "--strict", "--kube-version", tools.kube_version, str(CHART), "-f", str(bad),
                      check=False)
    assert proc.returncode != 0
    assert "replicas" in proc.stdout + proc.stderr


def test_helm_unittest_suites_pass(tools):
    proc = subprocess.run([tools.path("HELM_UNITTEST"), "--color=false", str(CHART)], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    suites = re.search(r"Test Suites:\s+(\d+) passed, (\d+) total", out)
    tests = re.search(r"Tests:\s+(\d+) passed, (\d+) total", out)
    assert suites and tests, out
    # Every suite file and every case in it ran: a vanished, renamed or unparsed file changes these counts.
    files = sorted((CHART / "tests").glob("*.y*ml"))  # a suite renamed off helm-unittest's *_test.yaml is missed
    cases = sum(len(yaml.safe_load(f.read_text()).get("tests") or []) for f in files)
    assert int(suites.group(1)) == int(suites.group(2)) == len(files) >= 8, out
    assert int(tests.group(1)) == int(tests.group(2)) == cases, (cases, out)


def test_helm_unittest_catches_a_broken_template(tools, tmp_path):
    """The unit tests bite: a chart whose rollout pool asks for GPUs fails them."""
    import shutil

    chart = tmp_path / "rl-platform"
    shutil.copytree(CHART, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    broken = text.replace("{{- $gpu := gt (int $g.gpus) 0 -}}", "{{- $gpu := true -}}")
    assert broken != text
    helpers.write_text(broken)
    proc = subprocess.run([tools.path("HELM_UNITTEST"), "--color=false", str(chart)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Should never request GPUs on rollout pods" in proc.stdout
