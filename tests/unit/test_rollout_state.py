"""rl-rollout's state in the Serve config (rl_rollout.state, targets.LocalFile) and its figures sources
(rl_rollout.sources): step parsing, the state's round trip through a real config file (which the server's own
schema accepts), the PromQL it sends (string level), the parsing and replica summing of stats answers, the
RayService patch (only serveConfigV2, resourceVersion as precondition, a conflict retried) against a fake API.
Both figures sources against the real thing (a policy server, a Prometheus scraping it) are in
tests/serving/test_rollout.py."""

from __future__ import annotations

import math

import pytest
import yaml

from rl_rollout import sources, state
from rl_rollout.errors import FiguresUnavailable, RolloutError
from rl_rollout.figures import Snapshot, VersionFigures
from rl_rollout.targets import LocalFile
from serving.config import ServerConfig

CONFIG = """\
# header comment: kept
# second line
proxy_location: EveryNode
applications:
  - name: policy
    route_prefix: /
    import_path: serving.app:build_app
    deployments:
      - name: PolicyServer
        num_replicas: 1
        user_config:
          max_batch_size: 8
          policies:
            cartpole: /ckpt/champ
            pong:
              checkpoint: /ckpt/pong
"""


@pytest.fixture
def cfg_file(tmp_path):
    p = tmp_path / "serve.yaml"
    p.write_text(CONFIG)
    return p


def user_config(path):
    return yaml.safe_load(path.read_text())["applications"][0]["deployments"][0]["user_config"]


def a_state(**kw) -> state.RolloutState:
    base = dict(id="r1", policy="cartpole", candidate="/ckpt/cand", champion="/ckpt/champ", mode="split",
                steps=[5.0, 25.0, 50.0, 100.0], step=1, interval_s=2.0, started_at=1.0, step_started_at=2.0)
    return state.RolloutState(**{**base, **kw})


# --------------------------------------------------------------------------------------------- steps
def test_steps_parse():
    assert state.parse_steps("5,25,50,100") == [5.0, 25.0, 50.0, 100.0]
    assert state.parse_steps(" 10%, 100 ") == [10.0, 100.0]
    assert state.parse_steps("100") == [100.0]


@pytest.mark.parametrize("text,why", [("0,50,100", "0 is not a percent in (0, 100]"),
                                      ("5,150", "150 is not a percent"), ("-5,100", "-5 is not a percent"),
                                      ("50,25,100", "steps must increase (25 after 50)"),
                                      ("5,5,100", "steps must increase"), ("5,25,50", "the last step must be 100"),
                                      ("5,x,100", "expected comma-separated percents"), ("", "expected comma"),
                                      ("nan,100", "is not a percent")])
def test_bad_steps_name_the_problem(text, why):
    with pytest.raises(RolloutError, match=why.replace("(", r"\(").replace(")", r"\)")):
        state.parse_steps(text)


# --------------------------------------------------------------------------------------------- config
def test_state_round_trip_through_a_real_config_file(cfg_file):
    snap = Snapshot(at=3.0, champion=VersionFigures(requests=5, latency_le=(1.0, math.inf), latency_counts=(4, 5)),
                    candidate=VersionFigures(requests=1, shadow={"compared": 1, "agreed": 1, "dropped": 0,
                                                                 "errors": 0}))
    st = a_state(baseline={"rollout": snap.to_json(), "step": snap.to_json()},
                 last={"at": 4.0, "action": "hold", "rule": "episodes", "reason": "r", "figures": {"p": math.inf}})
    st.event("start", "go", now=1.0)
    target = LocalFile(str(cfg_file))
    target.update(lambda cfg: state.with_rollout(cfg, st))
    text = cfg_file.read_text()
    assert text.startswith("# header comment: kept\n# second line\n")
    uc = user_config(cfg_file)
    assert uc["max_batch_size"] == 8 and uc["policies"]["pong"] == {"checkpoint": "/ckpt/pong"}
    cand = uc["policies"]["cartpole"]["candidate"]
    assert (cand["checkpoint"], cand["weight"], cand["mode"]) == ("/ckpt/cand", 0.25, "split")
    parsed = ServerConfig.parse(uc)  # the server's schema accepts what the controller writes
    assert parsed.candidates["cartpole"].weight == 0.25
    back = state.read_rollout(target.read(), "cartpole")
    assert back.to_json() == st.to_json()
    assert Snapshot.from_json(back.baseline["rollout"]) == snap
    assert back.last["figures"]["p"] == "+Inf"  # YAML-safe


def test_without_candidate_and_promoted_keep_the_spec_shape(cfg_file):
    cfg = LocalFile(str(cfg_file)).read()
    st = a_state()
    with_cand = state.with_rollout(cfg, st)
    pols = lambda c: c["applications"][0]["deployments"][0]["user_config"]["policies"]  # noqa: E731
    assert pols(state.without_candidate(cfg, "cartpole"))["cartpole"] == "/ckpt/champ"  # a string stays one
    assert pols(state.without_candidate(with_cand, "cartpole"))["cartpole"] == {"checkpoint": "/ckpt/champ"}
    prom = state.promoted(with_cand, "cartpole", "/ckpt/cand")
    assert pols(prom)["cartpole"] == {"checkpoint": "/ckpt/cand"} and pols(prom)["pong"] == pols(cfg)["pong"]
    assert state.read_rollout(prom, "cartpole") is None


def test_unknown_policy_is_named(cfg_file):
    with pytest.raises(RolloutError, match="unknown policy 'nope': the config serves cartpole, pong"):
        state.policy_spec(LocalFile(str(cfg_file)).read(), "nope")


def test_records_sidecar(cfg_file):
    t = LocalFile(str(cfg_file))
    assert t.read_record("cartpole") is None
    t.write_record("cartpole", {"id": "r1", "status": "promoted"})
    t.write_record("pong", {"id": "r2"})
    assert t.read_record("cartpole") == {"id": "r1", "status": "promoted"}
    assert (cfg_file.parent / ".serve.yaml.rollouts.json").is_file()


def test_a_file_that_is_no_serve_config_is_refused(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("a: [1\n")
    with pytest.raises(RolloutError, match="not valid YAML"):
        LocalFile(str(p)).read()
    p.write_text("a: 1\n")
    with pytest.raises(RolloutError, match="not a Serve config"):
        LocalFile(str(p)).read()


# --------------------------------------------------------------------------------------------- prometheus
def test_promql_per_figure():
    assert sources.query("requests", "cartpole") == \
        'sum by (version) (ray_rl_serve_version_requests_total{policy="cartpole"})'
    assert sources.query("errors", "cartpole", 'namespace="rl"') == \
        'sum by (version) (ray_rl_serve_version_requests_total{policy="cartpole",result="error",namespace="rl"})'
    assert sources.query("latency", "p.1") == \
        'sum by (version, le) (ray_rl_serve_version_latency_ms_bucket{policy="p.1"})'
    assert sources.query("shadow", "c") == 'sum by (outcome) (ray_rl_serve_shadow_total{policy="c"})'
    assert sources.query("return_sq_sum", "c").startswith("sum by (version) (ray_rl_serve_episode_return_sq_sum{")
    assert sources.query("served", "c") == 'sum by (version, checkpoint_id) (ray_rl_serve_version_info{policy="c"})'


@pytest.mark.parametrize("champ, cand, behind", [
    ("champ", "new", None), ("champ", None, "do not show candidate new yet"),
    (None, "new", "do not show champion champ yet"), (None, None, "do not show candidate new yet"),
    ("champ", "old", "still show candidate old, not new"), ("champ", "new+old", "still show candidate new+old"),
    ("other", "new", "still show champion other, not champ")])
def test_figures_that_do_not_show_the_rollouts_versions_yet_are_lagging(champ, cand, behind):
    """controller.lagging: the baseline waits for a source that names another checkpoint, or none, for a version
    the rollout applied (Prometheus seconds behind the server: CI took a baseline when the previous candidate was
    gone from the figures and this one not there yet)."""
    from rl_rollout.controller import lagging

    st = state.RolloutState(id="r", policy="cp", candidate="/c", champion="/h", candidate_checkpoint_id="new",
                            champion_checkpoint_id="champ")
    snap = Snapshot(at=1.0, champion=VersionFigures(checkpoint_id=champ), candidate=VersionFigures(checkpoint_id=cand),
                    source="prometheus http://p")
    why = lagging(st, snap)
    assert (why is None) if behind is None else (behind in why and "prometheus http://p" in why), why
    # A rollout that does not know a version's checkpoint (none recorded) takes the figures as they are.
    unknown = state.RolloutState(id="r", policy="cp", candidate="/c", champion="/h")
    assert lagging(unknown, snap) is None


@pytest.mark.parametrize("sel,ok", [('namespace="rl"', True), ('namespace="rl", pod=~"rl-.*"', True),
                                    ('job!="x",', True), ("{namespace='rl'}", False), ("namespace=rl", False),
                                    ('namespace="rl"} or vector(1) {', False)])
def test_prom_selector_validation(sel, ok):
    if ok:
        assert sources.check_selector(sel)
    else:
        with pytest.raises(RolloutError, match="--prom-selector"):
            sources.check_selector(sel)


def test_prometheus_unreachable_is_unavailable_with_one_line():
    p = sources.Prometheus("http://127.0.0.1:9", "cartpole")
    with pytest.raises(FiguresUnavailable, match=r"Prometheus at http://127.0.0.1:9 is unreachable: connection refused"):
        p.fetch()


# --------------------------------------------------------------------------------------------- server stats
STATS = {"policy": "cartpole", "replica": "r1", "at": 10.0, "versions": {
    "champion": {"checkpoint_id": "a", "weight": 0.75, "mode": None, "requests": 30, "errors": 1,
                 "latency_ms": {"le": [1.0, "+Inf"], "counts": [29, 29], "sum": 3.0, "count": 29},
                 "episodes": 3, "return_sum": 30.0, "return_sq_sum": 310.0, "active_sessions": 2},
    "candidate": {"checkpoint_id": "b", "weight": 0.25, "mode": "split", "requests": 10, "errors": 0,
                  "latency_ms": {"le": [1.0, "+Inf"], "counts": [9, 10], "sum": 3.0, "count": 10},
                  "episodes": 1, "return_sum": 9.0, "return_sq_sum": 81.0, "active_sessions": 1,
                  "shadow": {"compared": 0, "agreed": 0, "dropped": 0, "errors": 0}}}}


def test_stats_answers_parse_and_two_replicas_sum_bucket_by_bucket():
    """The pure part of sources.ServerStats (its fetch against the real server is in tests/serving/test_rollout.py):
    one replica's answer -> VersionFigures, and two replicas' figures of one version summed."""
    champ = sources.version_from_stats(STATS["versions"]["champion"])
    cand = sources.version_from_stats(STATS["versions"]["candidate"])
    assert cand.requests == 10 and cand.latency_le == (1.0, math.inf) and cand.latency_counts == (9, 10)
    assert champ.active_sessions == 2 and cand.checkpoint_id == "b" and champ.weight == 0.75
    assert cand.shadow == {"compared": 0, "agreed": 0, "dropped": 0, "errors": 0} and champ.shadow is None
    two = sources.add(cand, cand)
    assert two.requests == 20 and two.latency_counts == (18, 20) and two.active_sessions == 2
    assert sources.add(champ, champ).episodes == 6 and sources.add(champ, champ).return_sq_sum == 620.0
    other = sources.version_from_stats({**STATS["versions"]["candidate"],
                                        "latency_ms": {"le": [2.0, "+Inf"], "counts": [1, 1]}})
    with pytest.raises(FiguresUnavailable, match="replicas report different latency buckets"):
        sources.add(cand, other)


# --------------------------------------------------------------------------------------------- RayService
class FakeCustom:
    def __init__(self, text):
        self.obj = {"metadata": {"name": "rl", "resourceVersion": "1", "generation": 1},
                    "spec": {"serveConfigV2": text, "rayClusterConfig": {"x": 1}}, "status": {}}
        self.patches, self.conflicts = [], 1

    def get_namespaced_custom_object(self, group, version, ns, plural, name, **kw):
        return self.obj

    def patch_namespaced_custom_object(self, group, version, ns, plural, name, body, **kw):
        from kubernetes.client.rest import ApiException

        self.patches.append(body)
        if self.conflicts:
            self.conflicts -= 1
            self.obj["metadata"]["resourceVersion"] = "2"  # another writer
            raise ApiException(status=409, reason="Conflict")
        self.obj["spec"].update(body.get("spec", {}))
        return self.obj


def test_rayservice_patch_touches_only_serveconfigv2_and_retries_a_conflict(monkeypatch):
    from rl_rollout import targets

    fake = FakeCustom(CONFIG)
    kube = type("K", (), {"custom": fake, "namespace": "rl", "server": "https://k", "context": "c"})()
    monkeypatch.setattr("rl_submit.cli.connect", lambda *a: kube)
    t = targets.RayService("rl", "rl", None, None)
    t.update(lambda cfg: state.with_rollout(cfg, a_state()))
    assert len(fake.patches) == 2
    assert fake.patches[0]["metadata"] == {"resourceVersion": "1"}
    assert fake.patches[1]["metadata"] == {"resourceVersion": "2"}
    assert set(fake.patches[1]) == {"metadata", "spec"} and set(fake.patches[1]["spec"]) == {"serveConfigV2"}
    assert state.read_rollout(t.read(), "cartpole").id == "r1"
    assert fake.obj["spec"]["rayClusterConfig"] == {"x": 1}
