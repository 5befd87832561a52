"""Progressive delivery end to end: `rl-rollout` drives a real `python -m serving` (its --config file is the desired
state) while client threads play whole CartPole episodes through the API and post their returns as feedback.

- a good candidate (solved) over a weak champion goes 5 -> 25 -> 50 -> 100% and is promoted, surviving a
  controller killed mid-rollout (`rl-rollout resume` continues from the state in the config);
- a sabotaged candidate (an untrained, random-acting module) over the solved champion is rolled back on returns
  without ever leaving its first step;
- a candidate whose forward pass raises is rolled back on its error ratio, and a slow one on its p99.
In all of them: zero failed client requests, and no session is answered by two checkpoints.

And the controller's other paths, against the same server: a candidate that fails to load (rolled back with the
server's load error, the champion serving throughout); figures unavailable mid-rollout (paused with the reason in
the config, never promoted, a second `start` refused, `abort` stops the running controller); `--detach`, Ctrl-C
and `resume`; shadow mode (an identical candidate completes without promoting, a disagreeing one is rolled back
with --min-agreement); a registry candidate whose promotion moves the registry's champion (forced over the
offline gate with the rollout's reason); a split rollout judged on a real Prometheus scraping the server's Ray
metrics; the figures sources and bad candidates against the real server.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from conftest import REPO, ServerProcess, metric_samples, scrape, subprocess_env
from episode_clients import EpisodeClients
from faulty_modules import RaisingPPOModule, SlowPPOModule, faulty_checkpoint
from rl_checkpoint import Registry, Storage, read_eval_records, resolve, write_metadata
from rl_rollout import sources
from rl_rollout.errors import FiguresUnavailable
from trainer_helpers import free_port, stop_process, wait_for

pytestmark = [pytest.mark.serve, pytest.mark.slow]

BIN = Path(sys.executable).parent
INTERVAL_S = 3
# CartPole episodes are capped at 100 steps: a solved policy's episode is 100 requests, a random one's ~20.
MAX_STEPS = 100
# The p99 bound for rollouts whose subject is not latency: on a loaded 2-core CI machine every version's p99
# reached 650-900 ms at times (the default bound is 500 ms); the latency rule has its own case (`slow` below).
NOT_LATENCY = ("--max-p99-ms", "5000")
# The weak champion of the promotion tests is the seeded untrained module (cartpole_v2_checkpoint), weak by
# construction: the one-iteration trained checkpoint is usually weak, but one run's greedy policy held all its 142
# episodes to the 100-step cap, and "the candidate beats the champion" had nothing to show.


@pytest.fixture(scope="module")
def srv(serving_workdir, cartpole_checkpoint):
    (serving_workdir / "rollout_server").mkdir()
    # Ray's workers report metrics every 2 s instead of 10 s, so Prometheus sees an interval's traffic in time.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_metrics_report_interval_ms", "2000")
        s = ServerProcess(serving_workdir / "rollout_server", {"cp": cartpole_checkpoint})
    yield s
    rc = s.stop()
    assert rc == 0, s.log_tail()


def _champion(srv: ServerProcess) -> dict:
    return yaml.safe_load(srv.config_path.read_text())["applications"][0]["deployments"][0]["user_config"][
        "policies"]["cp"]


def _set_champion(srv: ServerProcess, checkpoint: str) -> None:
    srv.reload({"cp": checkpoint})
    want = resolve(checkpoint).checkpoint_id
    wait_for(lambda: requests.get(f"{srv.base}/v1/policies/cp", timeout=10).json().get("checkpoint_id") == want,
             60, f"the server to serve {want}")


def _rollout(srv: ServerProcess, *args: str) -> list[str]:
    return [str(BIN / "rl-rollout"), *args, "--config", str(srv.config_path), "--server", srv.base]


def _run(srv: ServerProcess, *args: str, timeout: float = 420) -> tuple[int, dict, str]:
    proc = subprocess.run(_rollout(srv, *args, "--json"), cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    record = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return proc.returncode, record, proc.stdout + proc.stderr


def _assert_clean(clients: EpisodeClients) -> None:
    assert not clients.failures, f"{len(clients.failures)} failed client requests: {clients.failures[:5]}"
    mixed = clients.mixed_sessions()
    assert not mixed, f"{len(mixed)} sessions answered by two checkpoints: {mixed[:3]}"


def _events(record: dict) -> list[str]:
    return [h["event"] for h in record.get("history", [])]


def test_good_candidate_is_promoted_step_by_step_and_survives_a_controller_restart(
        srv, cartpole_v2_checkpoint, solved_cartpole):
    _set_champion(srv, cartpole_v2_checkpoint)
    weak_id, good_id = resolve(cartpole_v2_checkpoint).checkpoint_id, resolve(solved_cartpole).checkpoint_id
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        ctl = subprocess.Popen(_rollout(srv, "start", "cp", solved_cartpole, "--steps", "5,25,50,100",
                                        "--interval", str(INTERVAL_S), "--min-episodes", "5",
                                        "--drain-timeout", "60", *NOT_LATENCY),
                               cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        try:
            # Kill the controller once the desired state in the config has moved past the first step.
            wait_for(lambda: ctl.poll() is not None or
                     (_champion(srv).get("candidate") or {}).get("rollout", {}).get("step", 0) >= 1,
                     240, "the rollout to reach its second step")
            assert ctl.poll() is None, f"the controller ended early:\n{ctl.stdout.read()}"
            ctl.send_signal(signal.SIGKILL)
            ctl.wait(timeout=30)
        finally:
            if ctl.poll() is None:
                ctl.kill()
        cand = _champion(srv)["candidate"]
        assert cand["rollout"]["status"] == "running" and cand["weight"] == 0.25, cand
        code, record, out = _run(srv, "resume", "cp")
    assert code == 0, out
    assert record["status"] == "promoted", record
    assert _events(record)[0] == "start" and "resume" in _events(record), _events(record)
    weights = [h["weight"] for h in record["history"] if h["event"] in ("start", "advance")]
    assert weights == [0.05, 0.25, 0.5, 1.0], record["history"]
    spec = _champion(srv)
    assert spec["checkpoint"] == solved_cartpole and "candidate" not in spec, spec
    info = requests.get(f"{srv.base}/v1/policies/cp", timeout=10).json()
    assert info["checkpoint_id"] == good_id and not info.get("candidate"), info
    _assert_clean(clients)
    returns = clients.returns_by_checkpoint()
    assert len(returns.get(good_id, [])) >= 5 and len(returns.get(weak_id, [])) >= 5, {k: len(v) for k, v in returns.items()}
    assert min(returns[good_id]) > sum(returns[weak_id]) / len(returns[weak_id]), returns


def test_sabotaged_candidate_is_rolled_back_on_returns_at_its_first_step(srv, solved_cartpole, cartpole_v2_checkpoint):
    _set_champion(srv, solved_cartpole)
    bad_id = resolve(cartpole_v2_checkpoint).checkpoint_id
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        # At 5% of new sessions the candidate ends ~1 episode per 20 champion ones (of 100 steps each): give the
        # step up to 40 intervals to see 5 of them (Binomial; 10 intervals fell short now and then).
        code, record, out = _run(srv, "start", "cp", cartpole_v2_checkpoint, "--interval", str(INTERVAL_S),
                                 "--min-episodes", "5", "--max-hold", "40", "--drain-timeout", "60", *NOT_LATENCY)
    assert code == 3, out
    assert record["status"] == "rolled_back" and "return" in record["reason"], record
    assert "advance" not in _events(record), record["history"]
    # Judged as soon as the data sufficed: at most two verdict-less intervals after both sides had 5 episodes.
    assert record["last"]["rule"] != "hold", record["last"]
    spec = _champion(srv)
    assert spec["checkpoint"] == solved_cartpole and "candidate" not in spec, spec
    _assert_clean(clients)
    assert len(clients.returns_by_checkpoint().get(bad_id, [])) >= 5


@pytest.mark.parametrize("fault, flags, rule_word", [
    (RaisingPPOModule, ("--max-error-ratio", "0.05"), "error"),
    (SlowPPOModule, ("--max-p99-ms", "50"), "p99"),
], ids=["raising", "slow"])
def test_failing_or_slow_candidate_is_rolled_back_with_no_failed_request(srv, serving_workdir, solved_cartpole, fault,
                                                                         flags, rule_word):
    _set_champion(srv, solved_cartpole)
    bad = faulty_checkpoint(serving_workdir / f"faulty_{fault.__name__}", fault)
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        code, record, out = _run(srv, "start", "cp", str(bad), "--steps", "25,50,100", "--interval",
                                 str(INTERVAL_S), "--min-episodes", "5", "--min-requests", "3",
                                 "--drain-timeout", "60", *flags)
    assert code == 3, out
    assert record["status"] == "rolled_back" and rule_word in record["reason"], record
    assert "advance" not in _events(record), record["history"]
    assert _champion(srv)["checkpoint"] == solved_cartpole
    _assert_clean(clients)


# ---------------------------------------------------------------------------------------------- the other paths
def _twin(src: str, dst: Path, checkpoint_id: str) -> str:
    """A copy of checkpoint `src` (same weights, so the same actions) under another checkpoint_id, without its
    evaluation records: a candidate that behaves exactly like `src` and that no offline evaluation vouches for."""
    if not dst.exists():
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("evaluations"))
        meta = resolve(src).metadata
        write_metadata(Storage.open(str(dst)), dataclasses.replace(meta, checkpoint_id=checkpoint_id))
    assert resolve(str(dst)).checkpoint_id == checkpoint_id and not read_eval_records(resolve(str(dst)).storage)
    return str(dst)


@pytest.fixture(scope="module")
def solved_twin(serving_workdir, solved_cartpole) -> str:
    return _twin(solved_cartpole, serving_workdir / "solved_twin", "solved-twin")


def _info(srv: ServerProcess) -> dict:
    return requests.get(f"{srv.base}/v1/policies/cp", timeout=10).json()


def _state(srv: ServerProcess) -> dict:
    """The rollout state in the config (policies.cp.candidate.rollout), {} when none."""
    spec = _champion(srv)
    return ((spec.get("candidate") or {}).get("rollout") or {}) if isinstance(spec, dict) else {}


def _record(srv: ServerProcess) -> dict:
    """The finished rollout's record, kept beside the config for `status`."""
    return json.loads((srv.config_path.parent / f".{srv.config_path.name}.rollouts.json").read_text())["cp"]


def _popen(srv: ServerProcess, *args: str) -> subprocess.Popen:
    return subprocess.Popen(_rollout(srv, *args), cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _plain(srv: ServerProcess, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """rl-rollout without --json: its one-line answer on stdout (or `error: ...` on stderr)."""
    return subprocess.run(_rollout(srv, *args), cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    return proc.returncode, out, err


def _one_line_error(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_a_candidate_that_fails_to_load_is_rolled_back_with_the_load_error(srv, solved_cartpole, trading_checkpoint):
    _set_champion(srv, solved_cartpole)
    champ_id = resolve(solved_cartpole).checkpoint_id
    with EpisodeClients(srv.base, "cp", clients=3, max_steps=MAX_STEPS) as clients:
        p = _plain(srv, "start", "cp", trading_checkpoint, "--interval", "2", "--apply-timeout", "60")
        wait_for(lambda: clients.episodes, 60, "an episode to end after the rollout")
    assert p.returncode == 3, p.stdout + p.stderr
    line = p.stdout.strip()
    assert len(line.splitlines()) == 1 and line.startswith("cp: rolled_back") and \
        "candidate failed to load: " in line, p.stdout + p.stderr
    # The server's own load error, word for word: the candidate serves another env than the champion.
    reason = _record(srv)["reason"]
    assert reason.startswith("candidate failed to load: ") and "trading" in reason and "cartpole" in reason, reason
    spec = _champion(srv)
    assert spec["checkpoint"] == solved_cartpole and "candidate" not in spec, spec
    info = _info(srv)
    assert info["checkpoint_id"] == champ_id and not info.get("candidate"), info
    _assert_clean(clients)
    assert set(clients.returns_by_checkpoint()) == {champ_id}  # the champion answered every request


def test_unavailable_figures_pause_without_promoting_a_second_start_is_refused_and_abort_stops_it(
        srv, solved_cartpole, solved_twin, cartpole_v2_checkpoint):
    _set_champion(srv, solved_cartpole)
    closed = f"http://127.0.0.1:{free_port()}"
    with EpisodeClients(srv.base, "cp", clients=2, max_steps=MAX_STEPS) as clients:
        d = _plain(srv, "start", "cp", solved_twin, "--interval", "2", "--detach")
        assert d.returncode == 0 and "rl-rollout resume cp" in d.stdout, d.stdout + d.stderr
        rollout_id = _state(srv)["id"]
        # The controller resumes with a Prometheus that does not answer: every interval is without figures.
        ctl = _popen(srv, "resume", "cp", "--prometheus", closed)
        try:
            st = wait_for(lambda: ctl.poll() is None and _state(srv).get("status") == "paused" and _state(srv),
                          60, "the rollout to pause")
            assert st["reason"].startswith("paused at 5%: figures unavailable: ") and \
                f"Prometheus at {closed} is unreachable: connection refused" in st["reason"], st["reason"]
            # It keeps retrying, and nothing moves on missing data.
            first = st["last"]["at"]
            st = wait_for(lambda: (_state(srv).get("last") or {}).get("at", first) > first and _state(srv), 30,
                          "another paused interval")
            assert st["status"] == "paused" and st["step"] == 0 and _champion(srv)["candidate"]["weight"] == 0.05
            assert [h["event"] for h in st["history"]] == ["start", "resume", "pause"], st["history"]
            s = _plain(srv, "status", "cp")
            assert s.returncode == 0 and s.stdout.startswith("cp: paused at 5%") and "unreachable" in s.stdout, s.stdout
            # A second rollout is refused while this one is active, naming it.
            _one_line_error(_plain(srv, "start", "cp", cartpole_v2_checkpoint), "a rollout of cp is already paused",
                            rollout_id, solved_twin)
            a = _plain(srv, "abort", "cp", "--reason", "prometheus is down")
            assert a.returncode == 0 and a.stdout.startswith("cp: aborted") and "prometheus is down" in a.stdout, \
                a.stdout + a.stderr
            code, out, err = _finish(ctl, 60)
        finally:
            if ctl.poll() is None:
                ctl.kill()
    assert code == 5, out + err
    assert f"rollout {rollout_id} aborted" in err and "prometheus is down" in err, err
    rec = _record(srv)
    assert rec["id"] == rollout_id and rec["status"] == "aborted", rec
    assert "promoted" not in [h["event"] for h in rec["history"]]
    spec = _champion(srv)
    assert spec["checkpoint"] == solved_cartpole and "candidate" not in spec, spec
    assert not _info(srv).get("candidate")
    _assert_clean(clients)


def test_detach_then_ctrl_c_then_resume_finishes_the_rollout(srv, solved_cartpole, solved_twin):
    _set_champion(srv, solved_cartpole)
    twin_id = resolve(solved_twin).checkpoint_id
    # 5 s intervals: from its first interval the resumed controller needs at least 3 more (advance, advance,
    # promote), so the Ctrl-C below lands mid-rollout even on a loaded machine.
    flags = ("--steps", "25,50,100", "--interval", "5", "--min-episodes", "5", "--min-requests", "5",
             "--drain-timeout", "60", *NOT_LATENCY)
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        d = _plain(srv, "start", "cp", solved_twin, *flags, "--detach")
        assert d.returncode == 0, d.stdout + d.stderr
        assert f"at 25% (split); drive it with `rl-rollout resume cp --config {srv.config_path}" in d.stdout, d.stdout
        s = _plain(srv, "status", "cp")
        assert s.stdout.startswith("cp: running at 25% (step 1/3, weight 0.25, split)") and \
            "no controller" in s.stdout, s.stdout
        assert _info(srv)["candidate"]["weight"] == 0.25  # the server applied the detached step
        ctl = _popen(srv, "resume", "cp")
        try:
            # Ctrl-C as soon as the resumed controller drives the rollout (its heartbeat is in the config).
            wait_for(lambda: ctl.poll() is not None or (_state(srv).get("controller") or {}).get("pid") == ctl.pid,
                     180, "the resumed controller to take the rollout over")
            assert ctl.poll() is None, ctl.communicate()
            ctl.send_signal(signal.SIGINT)
            code, _, err = _finish(ctl, 60)
        finally:
            if ctl.poll() is None:
                ctl.kill()
        assert code == 130, err
        st = _state(srv)
        assert st["status"] == "running" and st["controller"] is None and st["step"] < len(st["steps"]), st
        assert f"stays at {st['steps'][st['step']]:g}% in the config" in err, err
        # The desired state stays in the config, which the server applies by itself.
        wait_for(lambda: _info(srv)["candidate"]["weight"] == st["steps"][st["step"]] / 100, 60,
                 "the server to serve the candidate at the step in the config")
        code, record, out = _run(srv, "resume", "cp")
    assert code == 0, out
    assert record["status"] == "promoted", record
    events = _events(record)
    assert events[0] == "start" and events.count("resume") == 2 and events[-1] == "promoted", events
    spec = _champion(srv)
    assert spec["checkpoint"] == solved_twin and "candidate" not in spec, spec
    assert _info(srv)["checkpoint_id"] == twin_id
    _assert_clean(clients)


def test_shadow_identical_candidate_completes_without_promoting_and_a_disagreeing_one_is_rolled_back(
        srv, solved_cartpole, solved_twin, cartpole_v2_checkpoint):
    _set_champion(srv, solved_cartpole)
    champ_id = resolve(solved_cartpole).checkpoint_id
    with EpisodeClients(srv.base, "cp", clients=3, max_steps=MAX_STEPS) as clients:
        same = _plain(srv, "start", "cp", solved_twin, "--mode", "shadow", "--steps", "50,100", "--interval", "2",
                      "--min-requests", "20", *NOT_LATENCY)
        assert same.returncode == 0, same.stdout + same.stderr
        assert same.stdout.startswith("cp: completed") and "agreement 1.000" in same.stdout and \
            "shadow never promotes" in same.stdout, same.stdout
        spec = _champion(srv)
        assert spec["checkpoint"] == solved_cartpole and "candidate" not in spec, spec
        figs = _record(srv)["last"]["figures"]
        assert figs["agreement"] == 1.0 and figs["compared"] >= 20, figs

        other = _plain(srv, "start", "cp", cartpole_v2_checkpoint, "--mode", "shadow", "--steps", "50,100",
                       "--interval", "2", "--min-requests", "20", "--min-agreement", "0.9", *NOT_LATENCY)
        assert other.returncode == 3, other.stdout + other.stderr
        assert other.stdout.startswith("cp: rolled_back") and "candidate agreement 0." in other.stdout, other.stdout
        figs = _record(srv)["last"]["figures"]
        assert figs["agreement"] < 0.9 and figs["compared"] >= 20, figs
        assert "candidate" not in _champion(srv)
    _assert_clean(clients)
    # Shadow answers no client: every episode was played by the champion.
    assert set(clients.returns_by_checkpoint()) == {champ_id}
    assert set(clients.episodes_by_version()) == {"champion"}


def test_a_registry_candidate_promoted_moves_the_registry_champion_forced_with_the_rollout_reason(
        srv, serving_workdir, cartpole_v2_checkpoint, solved_twin):
    root = serving_workdir / "rollout_registry"
    reg = Registry.open(str(root))
    reg.register("cp", cartpole_v2_checkpoint)
    reg.promote("cp", 1, force_reason="test: the weak policy is the first champion")
    reg.register("cp", solved_twin)  # never evaluated: the offline gate refuses it
    assert not reg.gate("cp", 2).allowed
    ref = f"registry:{root}/cp@2"
    _set_champion(srv, cartpole_v2_checkpoint)
    twin_id = resolve(solved_twin).checkpoint_id
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        p = _plain(srv, "start", "cp", ref, "--steps", "50,100", "--interval", str(INTERVAL_S), "--min-episodes", "5",
                   "--min-requests", "5", "--drain-timeout", "60", *NOT_LATENCY)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("cp: promoted") and "registry champion v2 (forced)" in p.stdout, p.stdout
    rec = _record(srv)
    r = rec["outcome"]["registry"]
    assert r["moved"] and r["forced"] and r["champion"] == 2 and r["previous"] == 1, r
    assert r["force_reason"] == f"rl-rollout {rec['id']}: {rec['reason']}", (r, rec["reason"])
    # The registry itself: v2 is the champion, and its event records the forced promotion and why.
    reg = Registry.open(str(root))
    assert reg.get("cp").version == 2 and reg.aliases("cp")["previous"] == 1
    last = reg.history("cp")[-1]
    assert last["type"] == "promote" and last["version"] == 2 and last["forced"], last
    assert last["force_reason"] == r["force_reason"] and not last["gate"]["allowed"], last
    # The config serves the registry version; the server says which one.
    spec = _champion(srv)
    assert spec["checkpoint"] == ref and "candidate" not in spec, spec
    info = _info(srv)
    assert info["checkpoint_id"] == twin_id and info["registry"]["version"] == 2, info
    _assert_clean(clients)


def test_bad_candidates_are_refused_by_the_real_server(srv, solved_cartpole, serving_workdir):
    """Moved from the unit tests: the candidate checks after the server is reached, with nothing written."""
    _set_champion(srv, solved_cartpole)
    before = srv.config_path.read_text()
    _one_line_error(_plain(srv, "start", "cp", str(serving_workdir / "nothing")), "candidate checkpoint directory",
                    "does not exist")
    _one_line_error(_plain(srv, "start", "cp", f"registry:{serving_workdir}/noreg/cp@3"), "candidate 'registry:")
    _one_line_error(_plain(srv, "start", "cp", solved_cartpole), "is the champion of cp already")
    # A copy of the champion under another path is still the champion: its checkpoint_id says so.
    same_id = _twin(solved_cartpole, serving_workdir / "solved_copy", resolve(solved_cartpole).checkpoint_id)
    _one_line_error(_plain(srv, "start", "cp", same_id), "is the champion of cp already",
                    resolve(solved_cartpole).checkpoint_id)
    _one_line_error(_plain(srv, "start", "nope", same_id), "unknown policy 'nope'")
    assert srv.config_path.read_text() == before


def test_server_stats_source_reads_the_real_stats_endpoint(srv, solved_cartpole):
    """Moved from the unit tests: sources.ServerStats parses what the server answers; a wrong endpoint is
    unavailable with one line."""
    _set_champion(srv, solved_cartpole)
    with EpisodeClients(srv.base, "cp", clients=2, max_steps=20) as clients:
        wait_for(lambda: len(clients.episodes) >= 3, 60, "three episodes")
    src = sources.ServerStats(sources.ServerClient(srv.base), "cp")
    snap = src.fetch()
    raw = requests.get(f"{srv.base}/v1/policies/cp/stats", timeout=10).json()["versions"]["champion"]
    c = snap.champion
    assert snap.candidate is None and snap.source == f"server {srv.base}"
    assert (c.requests, c.errors, c.episodes) == (raw["requests"], raw["errors"], raw["episodes"])
    assert c.episodes >= 3 and c.requests >= c.episodes and c.return_sum == raw["return_sum"]
    assert c.latency_le[-1] == math.inf and list(c.latency_le[:-1]) == raw["latency_ms"]["le"][:-1]
    assert list(c.latency_counts) == raw["latency_ms"]["counts"] and c.latency_counts[-1] == c.requests - c.errors
    assert c.checkpoint_id == resolve(solved_cartpole).checkpoint_id and c.weight == 1.0
    assert c.active_sessions == 0  # the clients ended or deleted their sessions
    assert src.fetch().champion.requests == c.requests  # the same replica again replaces its own figures
    with pytest.raises(FiguresUnavailable, match=r"GET /v1/policies/nope/stats answered 404: .*nope"):
        sources.ServerStats(sources.ServerClient(srv.base), "nope").fetch()
    metrics_base = srv.metrics_url.rsplit("/", 1)[0]  # Ray's metrics port answers any path with text
    with pytest.raises(FiguresUnavailable, match="answered 200 without JSON"):
        sources.ServerStats(sources.ServerClient(metrics_base), "cp").fetch()


# ---------------------------------------------------------------------------------------------- Prometheus
@pytest.fixture(scope="module")
def prom(srv, serving_workdir):
    """A real Prometheus scraping the test server's Ray metrics port every second."""
    sys.path.insert(0, str(REPO / "tests" / "chart"))
    sys.path.insert(0, str(REPO / "tests" / "monitoring"))
    from chartkit import missing, tool_env
    from promkit import Prometheus, promconfig

    binary = tool_env().get("PROMETHEUS", "")
    if not binary or not os.path.exists(binary):
        missing("PROMETHEUS (the Prometheus server)")
    p = Prometheus(binary, promconfig.local_config([srv.metrics_url.split("/")[2]], [], interval="1s"),
                   serving_workdir / "rollout_prometheus")
    try:
        p.wait_for_targets(60)
        yield p
    finally:
        stop_process(p.proc, signal.SIGTERM, 30)


def _prom_value(prom, query: str) -> dict[str, float]:
    return {json.dumps(s["metric"], sort_keys=True): float(s["value"][1]) for s in prom.query(query)}


def test_a_split_rollout_judged_on_prometheus_figures(srv, prom, cartpole_v2_checkpoint, solved_twin):
    _set_champion(srv, cartpole_v2_checkpoint)
    weak_id, twin_id = resolve(cartpole_v2_checkpoint).checkpoint_id, resolve(solved_twin).checkpoint_id
    # Prometheus has seen the champion load (Ray reports every 2 s, scraped every 1 s).
    wait_for(lambda: _prom_value(prom, f'ray_rl_serve_version_info{{policy="cp",version="champion",'
                                       f'checkpoint_id="{weak_id}"}} == 1'), 60, "Prometheus to see the champion")
    with EpisodeClients(srv.base, "cp", clients=6, max_steps=MAX_STEPS) as clients:
        code, record, out = _run(srv, "start", "cp", solved_twin, "--prometheus", prom.url, "--steps", "50,100",
                                 "--interval", "6", "--min-episodes", "5", "--min-requests", "5",
                                 "--drain-timeout", "60", *NOT_LATENCY)
    assert code == 0, out
    assert record["status"] == "promoted", record
    assert record["source"]["prometheus"] == prom.url, record["source"]
    assert "figures unavailable" not in json.dumps(record["history"]), record["history"]
    figs = record["last"]["figures"]
    assert figs["candidate_episodes"] >= 5 and figs["champion_episodes"] >= 5, figs
    assert figs["candidate_requests"] >= 5 and figs["candidate_mean"] > figs["champion_mean"], figs
    # The window's mean is a mean of the candidate's episodes, the ones the clients played (a baseline taken before
    # Prometheus showed this candidate held the previous candidate's return sum, and the mean went negative).
    played = [e.ret for e in clients.episodes if e.checkpoints == {twin_id}]
    assert played and min(played) - 1e-6 <= figs["candidate_mean"] <= max(played) + 1e-6, (figs, sorted(played))
    assert _info(srv)["checkpoint_id"] == twin_id
    _assert_clean(clients)

    # The Prometheus source's snapshot is the Ray metrics the server exports, summed by version.
    def settled():
        text = scrape(srv.metrics_url)
        snap = sources.Prometheus(prom.url, "cp").fetch()
        want = {role: sum(v for _, v in metric_samples(text, "ray_rl_serve_version_requests_total", policy="cp",
                                                       version=role)) for role in ("champion", "candidate")}
        got = {"champion": snap.champion.requests, "candidate": snap.candidate.requests}
        return (snap, text) if want == got and want["champion"] > 0 else None

    snap, text = wait_for(settled, 30, "Prometheus to hold the server's last figures")
    ep = sum(v for _, v in metric_samples(text, "ray_rl_serve_episodes_total", policy="cp", version="champion"))
    assert snap.champion.episodes == ep > 0
    buckets = {float(lb["le"]): v for lb, v in metric_samples(text, "ray_rl_serve_version_latency_ms_bucket",
                                                              policy="cp", version="champion")}
    assert dict(zip(snap.champion.latency_le, snap.champion.latency_counts)) == buckets
    assert snap.champion.latency_le == tuple(sorted(buckets)) and snap.champion.latency_le[-1] == math.inf
    shadow = {lb["outcome"]: v for lb, v in metric_samples(text, "ray_rl_serve_shadow_total", policy="cp")}
    assert snap.candidate.shadow == {"compared": shadow.get("agree", 0) + shadow.get("disagree", 0),
                                     "agreed": shadow.get("agree", 0), "dropped": shadow.get("dropped", 0),
                                     "errors": shadow.get("error", 0)}
    assert snap.champion.active_sessions == sum(
        v for _, v in metric_samples(text, "ray_rl_serve_version_sessions", policy="cp", version="champion"))
