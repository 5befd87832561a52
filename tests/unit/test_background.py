"""hack/background.sh, what `make test` builds with while the suites run: its steps run one after another, detached
and niced; a failed step is logged and the next still runs; a second start while one runs is refused; `boost` raises
the running one to normal priority, except from a caller in no hurry (`low`, RLP_NO_BOOST=1) or from its own steps.
Real processes on a scratch RLP_CACHE; each step here waits on a file the test creates, so nothing depends on
timing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trainer_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "background.sh"


def _bg(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLP_CACHE": str(tmp_path / "cache")}
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def _nice_of_group(pgid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "ni=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return {int(n) for n in out.split()}


def test_steps_run_in_order_detached_niced_and_a_failure_does_not_stop_the_rest(tmp_path):
    out, gate = tmp_path / "out", tmp_path / "go"
    log = tmp_path / "cache" / "logs" / "background.log"
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    started = _bg(tmp_path, "start", f"echo a >> {out}", "false", f"{wait}; echo c >> {out}")
    assert started.returncode == 0, started.stderr
    assert "building in the background" in started.stderr and "[false]" in started.stderr, started.stderr
    pgid = int((tmp_path / "cache" / "logs" / "background.pgid").read_text())
    try:
        wait_for(lambda: "start: " + wait in log.read_text(), 30, "the third step to start")
        assert out.read_text() == "a\n"  # the first step ran; the third waits for the gate
        assert _nice_of_group(pgid) == {19}, "the background run is not at the lowest priority"

        again = _bg(tmp_path, "start", f"echo never >> {out}")
        assert again.returncode == 0 and "still running" in again.stderr, again.stderr

        if os.geteuid() == 0:  # lowering a nice value needs root
            quiet = _bg(tmp_path, "low", str(SCRIPT), "boost")  # the cold layout's cluster tier waiting (tests/k8s)
            assert quiet.returncode == 0 and not quiet.stderr, quiet.stderr
            assert _nice_of_group(pgid) == {19}, "a caller in no hurry (hack/background.sh low) raised the run"
            boost = _bg(tmp_path, "boost")
            assert boost.returncode == 0 and str(log) in boost.stderr, boost.stderr
            assert _nice_of_group(pgid) == {0}, "boost left the background run niced"
        gate.touch()
        wait_for(lambda: log.read_text().rstrip().endswith("done"), 30, "the background run to end",
                 on_timeout=log.read_text)
    finally:
        gate.touch()
    lines = [line.split("] ", 1)[1] for line in log.read_text().splitlines() if line.startswith("[background]")]
    assert [line.split(" ", 1)[1] if line[:2].isdigit() else line for line in lines] == [
        f"start: echo a >> {out}", "start: false", "FAILED (exit 1): false", f"start: {wait}; echo c >> {out}", "done"]
    assert out.read_text() == "a\nc\n"  # the refused second start ran nothing


def test_low_runs_its_command_niced_and_unable_to_boost_and_so_do_the_background_steps(tmp_path):
    probe = 'echo "$RLP_NO_BOOST $(ps -o ni= -p $$)"'
    low = _bg(tmp_path, "low", "bash", "-c", probe)
    assert low.returncode == 0 and low.stdout.split() == ["1", "19"], (low.stdout, low.stderr)
    out = tmp_path / "steps"
    assert _bg(tmp_path, "start", f"{probe} >> {out}").returncode == 0
    log = tmp_path / "cache" / "logs" / "background.log"
    wait_for(lambda: log.exists() and log.read_text().rstrip().endswith("done"), 30, "the background run to end")
    assert out.read_text().split() == ["1", "19"], "a background step could raise its own run (RLP_NO_BOOST unset)"


def test_boost_without_a_running_build_and_bad_usage(tmp_path):
    assert _bg(tmp_path, "boost").returncode == 0
    for args in ([], ["start"], ["bogus"], ["low"]):
        p = _bg(tmp_path, *args)
        assert p.returncode == 2 and "usage:" in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("target", ["bogus", "env"])
def test_tools_sh_refuses_an_unknown_target_in_one_line(tmp_path, target):
    """`env` only alone; an unknown target: the usage line, exit 2, nothing built."""
    env = {**os.environ, "RLP_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([str(ROOT / "hack" / "tools.sh"), "helm", target], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("usage:") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not list((tmp_path / "cache" / "tools").glob("helm-*")), "a target was built before the bad one was seen"
