"""Training from logged transitions and off-policy estimates, without Ray: the checks that refuse a bad
`offline.input` before Ray starts (trainer.offline.check_offline), the mapping to RLlib's offline_data, the
importance-sampling arithmetic, and `rl-eval --offline` recording beside the online evaluation (checkpoint and
registry) without changing the gate's decision."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hydra import compose, initialize_config_dir

from offline_logs import SCHEMA, row, write_rows
from rl_eval.offline import importance_estimates
from trainer.algo import build_algo_config
from trainer.config import register_configs
from trainer.errors import TrainerError
from trainer.offline import check_offline, check_offline_input, offline_data_kwargs

CONF = Path(__file__).resolve().parents[2] / "hydra_conf"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))  # make_checkpoint
register_configs()


def cfg_of(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def offline_cfg(*overrides: str, algo: str = "bc"):
    return cfg_of("~experiment", f"algo={algo}", "env=cartpole", *overrides)


def check(cfg) -> None:
    """What the trainer runs before Ray starts: the config rules (validate), then the log itself."""
    check_offline(cfg)
    check_offline_input(cfg)


def episode_rows(eps_id: str, steps: int, actions=None, logp: float = 0.0, seed: int = 0) -> list[dict]:
    obs = np.random.default_rng(seed).uniform(-0.05, 0.05, size=(steps, 4)).astype(np.float32)
    return [row(eps_id, t, obs[t], int(actions[t]) if actions is not None else t % 2, done=t == steps - 1,
                logp=logp) for t in range(steps)]


@pytest.fixture
def good_log(tmp_path) -> Path:
    rows = [r for i in range(3) for r in episode_rows(f"e{i}", 10, seed=i)]
    write_rows(tmp_path / "log" / "cartpole" / "part-00000.parquet", rows)
    return tmp_path / "log"


# ------------------------------------------------------------------------------------------- trainer checks


@pytest.mark.parametrize("algo", ["bc", "marwil"])
def test_a_good_log_passes_and_becomes_rllib_offline_data(good_log, algo):
    cfg = offline_cfg(f"offline.input={good_log}", "offline.updates_per_iteration=7", algo=algo)
    check(cfg)
    config = build_algo_config(cfg)
    assert config.algo_class.__name__ == algo.upper()
    assert config.input_ == [str(good_log / "cartpole" / "part-00000.parquet")]
    assert config.dataset_num_iters_per_learner == 7 and config.input_read_method == "read_parquet"
    # Only RLlib's columns reach the learner: the server's provenance columns are strings.
    assert config.input_read_method_kwargs["columns"] == ["eps_id", "obs", "new_obs", "actions", "rewards",
                                                          "terminateds", "truncateds", "t"]
    assert config.map_batches_kwargs == {"concurrency": 1} and config.input_filesystem is None
    if algo == "marwil":
        assert config.beta == 1.0


def _bad_column_log(tmp_path: Path, case: str) -> Path:
    folder = tmp_path / "bad" / "cartpole"
    rows = episode_rows("e", 4)
    if case == "missing_column":
        schema = pa.schema([f for f in SCHEMA if f.name != "new_obs"])
        write_rows(folder / "a.parquet", [{k: v for k, v in r.items() if k != "new_obs"} for r in rows], schema)
    elif case == "obs_shape":
        write_rows(folder / "a.parquet", [{**r, "obs": r["obs"][:3]} for r in rows])
    elif case == "action_type":
        schema = pa.schema([pa.field("actions", pa.list_(pa.int64())) if f.name == "actions" else f for f in SCHEMA])
        write_rows(folder / "a.parquet", [{**r, "actions": [1, 0]} for r in rows], schema)
    elif case == "not_parquet":
        folder.mkdir(parents=True)
        (folder / "a.parquet").write_bytes(b"this is not parquet")
    return tmp_path / "bad"


@pytest.mark.parametrize("case, message", [
    ("missing_column", "lacks column(s) new_obs"),
    ("obs_shape", "column obs holds observations of shape (3,), env 'cartpole' emits shape (4,)"),
    ("action_type", "column actions holds [1, 0], env 'cartpole' takes an integer action"),
    ("not_parquet", "a.parquet is not a readable Parquet file"),
])
def test_a_log_that_does_not_fit_the_env_is_refused_naming_the_file_and_column(tmp_path, case, message):
    cfg = offline_cfg(f"offline.input={_bad_column_log(tmp_path, case)}")
    with pytest.raises(TrainerError) as e:
        check(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_log_of_another_env_is_refused(good_log):
    with pytest.raises(TrainerError, match=r"env 'trading' emits shape"):
        check(cfg_of("~experiment", "algo=bc", "env=trading", f"offline.input={good_log}"))


@pytest.mark.parametrize("case, message", [
    ("no_input", "algo=bc trains from logged transitions: give offline.input="),
    ("online_algo", "offline.input is for algo=bc or algo=marwil; algo=ppo trains online"),
    ("missing", "does not exist"),
    ("empty", "holds no .parquet files"),
    ("only_json", "holds no .parquet files"),
    ("training_return", "stop.episode_return_mean is the return of training episodes"),
    ("framestack", "env pong stacks 4 frames per observation"),
    ("updates", "offline.updates_per_iteration must be >= 1, got 0"),
    ("steps_per_iteration", "size an iteration with offline.updates_per_iteration"),
])
def test_bad_offline_configs_are_refused_with_one_line(tmp_path, good_log, case, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "rows.json").write_text("{}")
    cfg = {
        "no_input": lambda: offline_cfg(),
        "online_algo": lambda: cfg_of("~experiment", "algo=ppo", f"offline.input={good_log}"),
        "missing": lambda: offline_cfg(f"offline.input={tmp_path / 'nowhere'}"),
        "empty": lambda: offline_cfg(f"offline.input={tmp_path / 'empty'}"),
        "only_json": lambda: offline_cfg(f"offline.input={tmp_path / 'json'}"),
        "training_return": lambda: offline_cfg(f"offline.input={good_log}", "stop.episode_return_mean=400"),
        "framestack": lambda: cfg_of("~experiment", "algo=bc", "env=pong", f"offline.input={good_log}"),
        "updates": lambda: offline_cfg(f"offline.input={good_log}", "offline.updates_per_iteration=0"),
        "steps_per_iteration": lambda: offline_cfg(f"offline.input={good_log}", "algo.steps_per_iteration=1000"),
    }[case]()
    with pytest.raises(TrainerError) as e:
        check(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_online_configs_without_offline_input_pass():
    check(cfg_of())  # the default experiment: PPO, no offline section set


def test_the_config_rules_read_no_file_so_rl_submit_can_check_a_pods_path(tmp_path):
    cfg = offline_cfg(f"offline.input={tmp_path / 'only-in-the-pod'}")
    check_offline(cfg)  # what trainer.validate (and so rl-submit) runs
    with pytest.raises(TrainerError, match="does not exist"):
        check_offline_input(cfg)  # what the training process runs


def test_a_log_on_s3_is_read_through_its_filesystem_with_the_uri_options(s3, good_log):
    import pyarrow.fs as pafs

    from rl_checkpoint import Storage

    uri = s3.uri("logs/unit")
    Storage.open(uri, create=False).upload_dir(str(good_log))
    cfg = offline_cfg(f"offline.input='{uri}'")
    check(cfg)
    kw = offline_data_kwargs(cfg)
    assert kw["input_"] == ["rlp/logs/unit/cartpole/part-00000.parquet"]
    assert isinstance(kw["input_filesystem"], pafs.S3FileSystem)
    with pytest.raises(TrainerError, match="does not exist"):
        check(offline_cfg(f"offline.input='{s3.uri('logs/none')}'"))


# ------------------------------------------------------------------------------------------- estimators


def test_importance_estimates_with_a_deterministic_logging_policy_truncate_at_the_first_disagreement():
    rewards = [np.ones(4), np.ones(3)]
    weights = [np.array([1.0, 1.0, 0.0, 1.0]), np.ones(3)]  # greedy vs greedy: 1 while the actions agree
    assert importance_estimates(rewards, weights, "pdis") == [2.0, 3.0]
    assert importance_estimates(rewards, weights, "is") == [0.0, 3.0]


def test_importance_estimates_with_a_stochastic_logging_policy():
    rewards, weights = [np.array([1.0, 3.0])], [np.array([2.0, 0.5])]
    assert importance_estimates(rewards, weights, "pdis") == [1 * 2 + 3 * (2 * 0.5)]
    assert importance_estimates(rewards, weights, "is") == [4 * (2 * 0.5)]


# ------------------------------------------------------------------------------------------- rl-eval --offline


@pytest.fixture
def candidate(tmp_path):
    from make_checkpoint import make_module_checkpoint

    return make_module_checkpoint(tmp_path / "candidate", "cartpole")


def _log_agreeing_for(ckpt: Path, folder: Path, agree: list[int], steps: int = 8) -> Path:
    """One episode per entry of `agree`: the logged action is the candidate's greedy one for that many steps,
    then the other one."""
    from serving.policy import LoadedPolicy

    pol = LoadedPolicy.load("t", str(ckpt))
    rows = []
    for i, k in enumerate(agree):
        ep = episode_rows(f"e{i}", steps, seed=i)
        greedy = pol.act(np.asarray([r["obs"] for r in ep], dtype=np.float32))
        for t, r in enumerate(ep):
            r["actions"] = int(greedy[t]) if t < k else 1 - int(greedy[t])
        rows += ep
    rows += episode_rows("open", 3)[:2]  # an episode still open when logged: skipped
    return write_rows(folder / "cartpole" / "part-00000.parquet", rows).parents[1]


def test_offline_estimate_is_recorded_in_the_checkpoint_and_the_registry_and_the_gate_ignores_it(
        tmp_path, candidate, capsys):
    from rl_checkpoint.policy_cli import main as rl_policy
    from rl_checkpoint.registry import Registry
    from rl_eval.cli import main as rl_eval

    log = _log_agreeing_for(candidate, tmp_path / "log", agree=[8, 3, 0])
    root = tmp_path / "registry"
    assert rl_policy(["--registry", str(root), "register", "cp", str(candidate)]) == 0
    reg = Registry.open(str(root))
    before = reg.gate("cp", 1).to_json()
    capsys.readouterr()

    assert rl_eval([f"registry:{root}/cp@1", "--offline", str(log), "--json"]) == 0
    out = capsys.readouterr()
    rec = json.loads(out.out.strip().splitlines()[-1])
    # Rewards are 1 per step: pdis = steps before the first disagreement; 2 of 24 transitions were incomplete.
    assert rec["estimates"] == [8.0, 3.0, 0.0] and rec["mean"] == pytest.approx(11 / 3)
    assert rec["agreement"] == pytest.approx(11 / 24) and rec["episodes_agreed"] == pytest.approx(1 / 3)
    assert rec["behaviour"] == "deterministic" and rec["skipped_transitions"] == 2
    assert rec["ci95"][0] <= rec["mean"] <= rec["ci95"][1] and rec["checkpoint_id"] == "cartpole-untrained-0"
    assert len(list((candidate / "offline_estimates").glob("*.json"))) == 1
    assert "recorded in the registry: cp v1" in out.err

    v = Registry.open(str(root)).get("cp", 1)
    assert [e["estimate_id"] for e in v.offline_estimates] == [rec["estimate_id"]]
    assert Registry.open(str(root)).gate("cp", 1).to_json() == before  # no_evaluation, as before
    assert rl_policy(["--registry", str(root), "show", "cp@1"]) == 0
    assert "offline     pdis estimate 3.67" in capsys.readouterr().out

    assert rl_eval([str(candidate), "--offline", str(log), "--method", "is", "--no-record"]) == 0
    assert "off-policy is estimate 2.67" in capsys.readouterr().out  # only the fully agreeing episode counts
    assert len(list((candidate / "offline_estimates").glob("*.json"))) == 1


@pytest.mark.parametrize("case, message", [
    ("other_env", "env 'trading' emits shape"),
    ("no_complete_episode", "holds no complete episode"),
    ("server", "--offline estimates from a log and plays no episode"),
    ("missing", "does not exist"),
])
def test_rl_eval_offline_bad_input_is_one_line_exit_2(tmp_path, candidate, good_log, capsys, case, message):
    from make_checkpoint import make_module_checkpoint

    from rl_eval.cli import main as rl_eval

    open_only = write_rows(tmp_path / "open" / "a.parquet", episode_rows("open", 3)[:2]).parent
    args = {
        "other_env": [str(make_module_checkpoint(tmp_path / "trading", "trading")), "--offline", str(good_log)],
        "no_complete_episode": [str(candidate), "--offline", str(open_only)],
        "server": [str(candidate), "--offline", str(good_log), "--server", "http://127.0.0.1:1", "--policy", "x"],
        "missing": [str(candidate), "--offline", str(tmp_path / "nowhere")],
    }[case]
    assert rl_eval(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (candidate / "offline_estimates").exists()
