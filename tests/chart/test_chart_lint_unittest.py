"""helm lint --strict for every ci/ install case, and the chart's helm-unittest suites."""

import re
import subprocess

import pytest

from chartkit import CHART, CI_VALUES

pytestmark = pytest.mark.chart


def test_ci_values_cover_the_install_cases():
    names = {p.name for p in CI_VALUES}
    assert {"cpu-only-values.yaml", "gpu-learners-values.yaml", "autoscaling-values.yaml",
            "monitoring-on-values.yaml", "monitoring-off-values.yaml"} <= names


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
    m = re.search(r"Tests:\s+(\d+) passed, (\d+) total", out)
    assert m, out
    # The suites under charts/rl-platform/tests: a drop in the count means a suite stopped being picked up.
    assert int(m.group(1)) == int(m.group(2)) >= 45, out


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
