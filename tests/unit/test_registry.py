"""The policy registry (rl_checkpoint.registry), its promotion gate (rl_checkpoint.gate) and `rl-policy`.

Checkpoints here are bare RLModule directories as `resolve` reads them (RLlib's marker file + rl_platform.json, no
weights: nothing loads them) with real evaluation records (`EvalRecord.from_episodes` + `write_eval_record`), so
the suite needs no Ray and no training. Bad input goes through the installed `rl-policy` console script; the
races run as separate processes against a local root and against a local S3 server (moto)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from rl_checkpoint import (CheckpointMetadata, EvalRecord, PromotionRefused, Registry, RegistryError,
                           RunState, Storage, is_registry_ref, judge, make_ref, parse_ref, resolve_ref,
                           write_eval_record, write_metadata, write_state)
from rl_checkpoint.checkpoint import _MODULE_MARKER
from rl_checkpoint.gate import solved_return, welch_greater

BIN = Path(sys.executable).parent


# --------------------------------------------------------------------------------------------- helpers


def make_ckpt(path: Path, env: str | None = "cartpole", cid: str | None = None) -> str:
    st = Storage.open(str(path))
    st.write_bytes(b"", _MODULE_MARKER)
    if env is not None:
        write_metadata(st, CheckpointMetadata(checkpoint_id=cid or path.name, env=env, module_dir="."))
    return str(path)


def add_eval(ckpt: str, returns, env: str = "cartpole", cid: str | None = None) -> EvalRecord:
    rec = EvalRecord.from_episodes(checkpoint_id=cid or Path(ckpt).name, env=env, returns=list(returns),
                                   lengths=[max(int(r), 1) for r in returns], seeds=list(range(len(returns))),
                                   wall_s=1.0)
    write_eval_record(Storage.open(ckpt, create=False), rec)
    return rec


def returns(mean: float, spread: float, n: int = 20, seed: int = 0, cap: float = 500.0) -> list[float]:
    return list(np.minimum(np.random.default_rng(seed).normal(mean, spread, n), cap))


def record(rets, env="cartpole") -> EvalRecord:
    return EvalRecord.from_episodes(checkpoint_id="x", env=env, returns=list(rets), lengths=[1] * len(rets),
                                    seeds=list(range(len(rets))), wall_s=0.0)


def rl_policy(*args: str, registry: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RL_REGISTRY"}
    if registry is not None:
        env["RL_REGISTRY"] = registry
    return subprocess.run([str(BIN / "rl-policy"), *args], env=env, capture_output=True, text=True, timeout=120)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------- references


@pytest.mark.parametrize("ref, root, name, alias", [
    ("registry:/srv/reg/cartpole", "/srv/reg", "cartpole", "champion"),
    ("registry:/srv/reg/cartpole@3", "/srv/reg", "cartpole", "3"),
    ("registry:/cartpole@previous", "/", "cartpole", "previous"),
    ("registry:reg/cp@canary", "reg", "cp", "canary"),
    ("registry:cp@2", None, "cp", "2"),  # root from $RL_REGISTRY
    ("registry:s3://bkt/cartpole@champion", "s3://bkt", "cartpole", "champion"),
    ("registry:s3://bkt/a/b/pong.v2@7?endpoint_override=127.0.0.1:9000&scheme=http",
     "s3://bkt/a/b?endpoint_override=127.0.0.1:9000&scheme=http", "pong.v2", "7"),
])
def test_registry_references_parse_and_round_trip(ref, root, name, alias):
    assert is_registry_ref(ref) and parse_ref(ref) == (root, name, alias)
    if root is not None:
        assert parse_ref(make_ref(root, name, alias)) == (root, name, alias)


@pytest.mark.parametrize("ref, message", [
    ("/srv/reg/cartpole", "not a registry reference"),
    ("registry:s3://bkt", "names no policy"),
    ("registry:/srv/reg/", "policy name ''"),
    ("registry:/srv/reg/bad name@1", "policy name 'bad name'"),
    ("registry:cp?scheme=http", "URI options need a root"),
])
def test_bad_registry_references_name_the_problem(ref, message):
    with pytest.raises(RegistryError, match=message):
        parse_ref(ref)


# --------------------------------------------------------------------------------------------- the gate


def test_gate_rules_in_order_with_their_figures():
    solved, weak = record(returns(498, 2, seed=1)), record(returns(20, 5, seed=2))
    d = judge(None, solved, env_solved=475)
    assert (d.allowed, d.rule) == (False, "no_evaluation")

    d = judge(weak, None, env_solved=475.0)
    assert (d.allowed, d.rule) == (False, "min_return")
    assert f"{weak.ci95[0]:.2f}" in d.message and "475" in d.message and "n=20" in d.message
    assert d.figures["min_return"] == 475 and d.figures["candidate"]["ci95"] == weak.ci95
    d = judge(weak, None, min_return=10, env_solved=475)  # --min-return replaces the solved threshold
    assert d.allowed and d.figures["min_return_source"] == "--min-return"
    assert judge(weak, None).allowed  # no floor (e.g. the trading env has no solved threshold)

    d = judge(record(returns(498, 2, seed=3), env="pong"), solved)
    assert (d.allowed, d.rule, d.forceable) == (False, "env_mismatch", False)

    same = record(returns(498, 2, seed=4))
    d = judge(same, solved, env_solved=475)
    assert (d.allowed, d.rule) == (False, "not_better") and "p=" in d.message
    p = stats.ttest_ind(same.returns, solved.returns, equal_var=False, alternative="greater").pvalue
    assert d.figures["p_value"] == pytest.approx(p) and p >= 0.05

    better = record(returns(499.5, 0.3, seed=5))
    d = judge(better, record(returns(480, 5, seed=6)), env_solved=475)
    assert (d.allowed, d.rule) == (True, "passed") and d.figures["p_value"] < 0.05
    assert len(d.message.splitlines()) == 1 and json.loads(json.dumps(d.to_json()))["rule"] == "passed"


def test_gate_on_degenerate_samples():
    # Two constant samples: better iff the mean is greater (p 0 or 1), never for equal perfect scores.
    assert welch_greater([500.0] * 10, [500.0] * 10) == (0.0, 1.0)
    assert welch_greater([500.0] * 10, [499.0] * 10)[1] == 0.0
    assert not judge(record([500.0] * 20), record([500.0] * 20)).allowed
    # One constant side: a one-sample t-test of the other side against its mean.
    champ = [490.0, 495.0, 480.0, 500.0]
    p = stats.ttest_1samp(champ, 500.0, alternative="less").pvalue
    assert welch_greater([500.0] * 20, champ)[1] == pytest.approx(p)
    assert welch_greater([500.0], champ)[1] == pytest.approx(p)  # one episode counts as zero variance
    assert solved_return("cartpole") == 475 and solved_return("trading") is None and solved_return("nope") is None


# --------------------------------------------------------------------------------------------- the registry


def test_register_alias_promote_rollback_fold(tmp_path):
    a = make_ckpt(tmp_path / "a")
    add_eval(a, returns(480, 4, seed=1))
    b = make_ckpt(tmp_path / "b")
    add_eval(b, [500.0] * 20)
    c = make_ckpt(tmp_path / "c")
    add_eval(c, returns(499.8, 0.2, seed=3))  # not better than a constant 500
    reg = Registry(str(tmp_path / "reg"))  # created on first register: its parent exists

    v1 = reg.register("cp", a)
    assert (v1.version, v1.env, v1.checkpoint, v1.checkpoint_id) == (1, "cartpole", a, "a")
    assert v1.eval[0]["episodes"] == 20 and v1.eval_records[0].returns == pytest.approx(returns(480, 4, seed=1))
    assert v1.registered_by and v1.created and v1.run_dir is None and v1.config_hash is None
    assert reg.register("cp", b).version == 2 and reg.register("cp", c).version == 3
    assert reg.register("cp", a).version == 1  # the same checkpoint again: its version, no new event

    with pytest.raises(PromotionRefused, match="rule min_return: cp v3's 95% CI lower bound 499.") as refused:
        reg.promote("cp", "latest", min_return=600)
    assert refused.value.decision.rule == "min_return"
    first = reg.promote("cp", 1)
    assert (first.version, first.previous, first.decision.rule, first.forced) == (1, None, "passed", False)
    assert reg.promote("cp", 2).previous == 1
    with pytest.raises(PromotionRefused, match="not_better.*champion v2") as refused:
        reg.promote("cp", 3)
    assert refused.value.decision.figures["p_value"] >= 0.05
    with pytest.raises(RegistryError, match="already the champion"):
        reg.promote("cp", 2)
    forced = reg.promote("cp", 3, force_reason="canary looked fine")
    assert forced.forced and forced.force_reason == "canary looked fine" and forced.previous == 2
    assert reg.aliases("cp") == {"champion": 3, "previous": 2, "latest": 3}

    reg.set_alias("cp", "canary", 1)
    reg.set_alias("cp", "staging", "canary")  # an alias may name another alias
    assert reg.get("cp", "staging").version == 1 and set(reg.get("cp", 1).aliases) == {"canary", "staging"}
    with pytest.raises(RegistryError, match="registry's own"):
        reg.set_alias("cp", "champion", 1)

    # Rollback pops the champion stack [1, 2, 3]: champion 2 / previous 1, then 1 / none, then refused.
    assert (reg.rollback("cp").version, reg.get("cp", "previous").version) == (2, 1)
    back = reg.rollback("cp")
    assert (back.version, back.previous) == (1, None) and "previous" not in reg.aliases("cp")
    with pytest.raises(RegistryError, match="no previous champion"):
        reg.rollback("cp")

    fresh = Registry(str(tmp_path / "reg"))  # the same state, folded from the files alone
    assert fresh.aliases("cp") == reg.aliases("cp") == {"champion": 1, "canary": 1, "staging": 1, "latest": 3}
    assert [v.version for v in fresh.versions("cp")] == [1, 2, 3] and fresh.names() == ["cp"]
    events = fresh.history("cp")
    assert [e["type"] for e in events] == ["register"] * 3 + ["promote"] * 3 + ["alias"] * 2 + ["rollback"] * 2
    assert events[5]["forced"] and events[5]["force_reason"] == "canary looked fine"
    assert events[5]["gate"]["rule"] == "not_better"
    assert sorted(os.listdir(tmp_path / "reg" / "cp" / "events")) == [f"{i:09d}.json" for i in range(1, 11)]

    version, ckpt = resolve_ref(f"registry:{tmp_path / 'reg'}/cp")
    assert version.version == 1 and ckpt.checkpoint_id == "a"
    assert resolve_ref(make_ref(str(tmp_path / "reg"), "cp", 2))[1].location == b


def test_provenance_env_and_changed_checkpoints(tmp_path, monkeypatch):
    run = tmp_path / "run"
    final = make_ckpt(run / "checkpoints" / "final", cid="run-final-1")
    add_eval(final, [500.0] * 5, cid="run-final-1")
    (run / "config.yaml").write_text("algo: ppo\n")
    write_state(Storage.open(str(run)), RunState(latest_checkpoint="checkpoints/final"))
    reg = Registry(str(tmp_path / "reg"))
    v = reg.register("cp", str(run), note="nightly")  # a run dir: its latest checkpoint
    assert v.checkpoint == final and v.run_dir == str(run) and v.extra == {"note": "nightly"}
    assert v.config_hash == hashlib.sha256(b"algo: ppo\n").hexdigest()
    assert v.git_commit and len(v.git_commit) == 40  # the tests run in a git checkout
    other = make_ckpt(tmp_path / "other")  # not inside a run dir: the caller names the run and the commit
    v2 = reg.register("cp", other, git_commit="abc123", run_dir=str(run))
    assert (v2.git_commit, v2.run_dir, v2.config_hash) == ("abc123", str(run), v.config_hash)

    pong = make_ckpt(tmp_path / "pong", env="pong")
    with pytest.raises(RegistryError, match="env 'pong', policy 'cp' for 'cartpole'"):
        reg.register("cp", pong)

    # The checkpoint rewritten in place (a resumed run's final/): the registry will not promote or serve it.
    write_metadata(Storage.open(final), CheckpointMetadata(checkpoint_id="run-final-2", env="cartpole",
                                                           module_dir="."))
    with pytest.raises(RegistryError, match="changed since registration"):
        reg.promote("cp", 1)
    with pytest.raises(RegistryError, match="changed since registration"):
        resolve_ref(make_ref(str(tmp_path / "reg"), "cp", 1))


# --------------------------------------------------------------------------------------------- rl-policy


def _unwritable_root(tmp_path: Path) -> str:
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return str(ro)
    if not os.path.isdir("/sys/kernel"):
        pytest.skip("running as root without sysfs: no directory root cannot write")
    return "/sys"  # sysfs refuses new entries even to root


def test_rl_policy_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path):
    root = tmp_path / "reg"
    good = make_ckpt(tmp_path / "good")
    add_eval(good, [500.0] * 20)
    weak = make_ckpt(tmp_path / "weak")
    add_eval(weak, returns(20, 5))
    bare = make_ckpt(tmp_path / "bare")
    pong = make_ckpt(tmp_path / "pong", env="pong")
    afile = tmp_path / "afile"
    afile.write_text("")
    r = str(root)
    reg = Registry(r)
    assert [reg.register("cp", c).version for c in (good, weak, bare)] == [1, 2, 3]
    reg.promote("cp", 1)
    before = tree(root)

    cases = [  # (argv, registry env, what the one line must say)
        (["show", "nope"], r, "no policy 'nope' in registry"),
        (["show", "cp@nope"], r, "no version or alias 'nope' (versions: v1..v3; aliases: champion->v1"),
        (["alias", "cp", "canary", "9"], r, "no version or alias '9'"),
        (["promote", "cp", "3"], r, "rule no_evaluation: cp v3 has no evaluation"),
        (["promote", "cp", "2"], r, "rule min_return: cp v2's 95% CI lower bound"),
        (["promote", "cp", "2", "--min-return", "10"], r, "rule not_better"),
        (["promote", "cp", "2", "--force", " "], r, "needs a reason"),
        (["rollback", "cp"], r, "no previous champion"),
        (["register", "cp", str(pong)], r, "is for env 'pong', policy 'cp' for 'cartpole'"),
        (["register", "cp", str(tmp_path / "missing")], r, "does not exist"),
        (["--registry", str(tmp_path / "no" / "reg"), "list", "cp"], None, "does not exist (nor its parent"),
        (["register", "cp", good, "--registry", str(afile / "reg")], None, "its parent"),
        (["register", "cp", good], _unwritable_root(tmp_path), "is not writable"),
        (["list"], None, "no registry: pass --registry ROOT or set RL_REGISTRY"),
        (["list", "--registry", "gs://bucket/reg"], None, "scheme 'gs' is not supported"),
    ]
    procs = [(argv, want, subprocess.Popen([str(BIN / "rl-policy"), *argv], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True,
                                           env={**{k: v for k, v in os.environ.items() if k != "RL_REGISTRY"},
                                                **({"RL_REGISTRY": reg} if reg else {})}))
             for argv, reg, want in cases]
    for argv, want, proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (argv, out, err)
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and want in err, (argv, err)
    assert tree(root) == before  # nothing half-written: no event, no temp file
    assert not (tmp_path / "no").exists() and not (afile / "reg").exists()

    forced = rl_policy("promote", "cp", "2", "--force", "hotfix: the weak one is a placeholder", registry=r)
    assert forced.returncode == 0 and "FORCED" in forced.stdout, forced.stderr
    history = reg.history("cp")
    assert history[-1]["force_reason"] == "hotfix: the weak one is a placeholder" and history[-1]["forced"]
    assert history[-1]["gate"]["rule"] == "min_return"
    shown = json.loads(rl_policy("show", "cp@previous", "--json", registry=r).stdout)
    assert shown["version"] == 1 and shown["eval"][0]["mean"] == 500.0 and "previous" in shown["aliases"]
    listed = rl_policy("list", "cp", registry=r)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 3
    assert "exit codes" in rl_policy("--help").stdout.lower()


# --------------------------------------------------------------------------------------------- races


RACERS = 8


def _racer(root: str, ckpt: str, i: int, env: dict, barrier, out) -> None:
    os.environ.update(env)
    reg = Registry(root)
    done = []
    try:
        barrier.wait(timeout=60)
        v = reg.register("cp", ckpt).version
        done.append(("register", v, ckpt))
        res = reg.promote("cp", v, force_reason=f"racer {i}")
        done.append(("promote", v, res.seq))
        reg.set_alias("cp", "canary", v)
        reg.set_alias("cp", f"w{i}", v)
        done.append(("alias", v, i))
        done.append(("conflicts", reg.conflicts, i))
    except Exception as e:  # reported to the test, which fails on it
        done.append(("error", repr(e), i))
    out.put(done)


def _race(root: str, tmp_path: Path, env: dict) -> list:
    ckpts = []
    for i in range(RACERS):
        ck = make_ckpt(tmp_path / f"c{i}")
        add_eval(ck, returns(490 + i, 2, n=5, seed=i))
        ckpts.append(ck)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["rl_checkpoint.registry", "scipy.stats", "boto3", "rl_envs"])
    barrier, out = ctx.Barrier(RACERS), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(root, ckpts[i], i, env, barrier, out)) for i in range(RACERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errors = [d for r in results for d in r if d[0] == "error"]
    assert not errors, errors
    return results


def _check_race(results: list, events: dict[str, bytes]) -> tuple[int, int, int]:
    """The log is contiguous, every call is in it exactly once, the promotions form one chain; -> the champion,
    previous and canary its last events leave."""
    n = len(events)
    assert sorted(events) == [f"{i:09d}.json" for i in range(1, n + 1)], sorted(events)
    log = [json.loads(events[f"{i:09d}.json"]) for i in range(1, n + 1)]  # every file parses: none torn
    assert [e["seq"] for e in log] == list(range(1, n + 1)) and n == RACERS * 4

    registered = {e["record"]["checkpoint"]: e["version"] for e in log if e["type"] == "register"}
    assert sorted(registered.values()) == list(range(1, RACERS + 1))
    promotes = [e for e in log if e["type"] == "promote"]
    for r in results:
        (_, v, ckpt), (_, pv, seq), (_, av, i), _ = r
        assert registered[ckpt] == v == pv == av
        assert [e["seq"] for e in promotes if e["version"] == v] == [seq]
        assert [e["version"] for e in log if e["type"] == "alias" and e["alias"] == f"w{i}"] == [v]
    # No lost update: each promotion moved the champion the one before it left.
    assert [e["from"] for e in promotes] == [None] + [e["version"] for e in promotes[:-1]]
    canary = [e["version"] for e in log if e["type"] == "alias" and e["alias"] == "canary"]
    assert len(canary) == RACERS
    assert sum(r[3][1] for r in results) > 0, "the writers never raced (no event number was lost and retried)"
    return promotes[-1]["version"], promotes[-2]["version"], canary[-1]


def test_racing_writers_on_a_local_root(tmp_path):
    root = tmp_path / "reg"
    root.mkdir()
    results = _race(str(root), tmp_path, {})
    champion, previous, canary = _check_race(results, tree(root / "cp" / "events"))
    aliases = Registry(str(root)).aliases("cp")
    assert (aliases["champion"], aliases["previous"], aliases["canary"]) == (champion, previous, canary)


def test_racing_writers_on_s3(s3, tmp_path):
    import pyarrow.fs as pafs

    from rl_checkpoint.registry import _S3Log

    root = s3.uri("registry-race")
    log = _S3Log(s3.uri("registry-probe"))  # the store refuses to create an existing key (If-None-Match: *)
    assert log.create("p", 1, b"{}") and not log.create("p", 1, b"{ }") and log.read("p", 1) == b"{}"
    results = _race(root, tmp_path, dict(s3.CREDS))
    infos = s3.fs.get_file_info(pafs.FileSelector(f"{s3.BUCKET}/registry-race/cp/events"))
    events = {i.base_name: s3.fs.open_input_stream(i.path).read() for i in infos}
    champion, previous, canary = _check_race(results, events)
    aliases = Registry(root).aliases("cp")
    assert (aliases["champion"], aliases["previous"], aliases["canary"]) == (champion, previous, canary)
    with pytest.raises(RegistryError, match="does not exist"):
        Registry(s3.uri("registry-race").replace("s3://rlp/", "s3://no-such-bucket/")).names()
