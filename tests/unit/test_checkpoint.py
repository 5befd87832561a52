"""The checkpoint contract (rl_checkpoint): layout, metadata, run state, resolve, and reading from an object store."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rl_checkpoint import (BEST, FINAL, METADATA_FILE, CheckpointError, CheckpointMetadata, RunCheckpoints, RunState, Storage,
                           checkpoint_rel, iter_name, read_metadata, resolve, write_metadata, write_state)
from rl_checkpoint.checkpoint import FORMAT_VERSION, MODULE_DIR, _MODULE_MARKER

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))


def _meta(**kw) -> CheckpointMetadata:
    return CheckpointMetadata.new(experiment="x", name="final", iteration=3, env_steps=300,
                                  episode_return_mean=float("nan"), env="cartpole", **kw)


def _algo_checkpoint(storage: Storage, rel: str, meta: CheckpointMetadata | None) -> None:
    """The layout RLlib's algo.save_to_path leaves (the module's files themselves are not read by resolve)."""
    storage.write_bytes(b"", rel, MODULE_DIR, _MODULE_MARKER)
    if meta is not None:
        write_metadata(storage, meta, rel)


def test_metadata_round_trips_and_is_versioned(tmp_path):
    st = Storage.open(str(tmp_path))
    meta = _meta(framestack=4)
    write_metadata(st, meta)
    back = read_metadata(st)
    assert back == meta and back.format_version == FORMAT_VERSION and back.episode_return_mean is None
    assert meta.checkpoint_id.startswith("x-final-iter3-steps300-")
    st.write_json({**meta.to_json(), "format_version": FORMAT_VERSION + 1}, METADATA_FILE)
    with pytest.raises(CheckpointError, match="newer than this code reads"):
        read_metadata(st)
    st.write_json({**meta.to_json(), "framestack": 0, "added_later": 1}, "rl", METADATA_FILE)  # unknown keys: fine
    with pytest.raises(CheckpointError, match="framestack"):
        read_metadata(st, "rl")


def test_resolve_names_what_is_wrong(tmp_path):
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'nope'}.*does not exist"):
        resolve(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        resolve(str(tmp_path / "file"))
    st = Storage.open(str(tmp_path / "partial"))
    write_metadata(st, _meta())  # metadata written, RLModule missing (an interrupted upload)
    with pytest.raises(CheckpointError, match="holds no RLModule"):
        resolve(st.location)
    with pytest.raises(CheckpointError, match="selector"):
        resolve(str(tmp_path), "newest")


def test_resolve_a_run_by_latest_best_final(tmp_path):
    run = Storage.open(str(tmp_path / "run"))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        write_state(run, RunState()) or resolve(run.location)
    for name in (iter_name(2), BEST, FINAL):
        _algo_checkpoint(run, checkpoint_rel(name), _meta())
    write_state(run, RunState(latest_checkpoint=checkpoint_rel(iter_name(2)), iteration=2))
    assert resolve(run.location).location == run.uri(checkpoint_rel(iter_name(2)))
    assert resolve(run.location, FINAL).module_rel == MODULE_DIR
    assert resolve(run.location, BEST).location.endswith(checkpoint_rel(BEST))


def test_run_checkpoints_keep_the_newest_periodic_ones(tmp_path):
    run = Storage.open(str(tmp_path))
    ckpts = RunCheckpoints(run, keep=2)
    for i in (1, 2, 3):
        rel = checkpoint_rel(iter_name(i))
        _algo_checkpoint(run, rel, _meta())
        ckpts.add_periodic(rel)
        ckpts.commit(rel, iteration=i, env_steps=10 * i, episode_return_mean=1.0)
    assert ckpts.state.periodic == [checkpoint_rel(iter_name(2)), checkpoint_rel(iter_name(3))]
    assert not run.exists(checkpoint_rel(iter_name(1)))
    again = RunCheckpoints(run, keep=2)  # read back from the run state on disk
    assert again.latest == checkpoint_rel(iter_name(3)) and again.state.env_steps == 30 and again.is_complete(again.latest)


def test_one_stop_rule_for_the_loop_and_tune():
    from trainer.callbacks import RETURN_MEAN_KEY, RETURN_WINDOW_KEY
    from trainer.stopping import StopRule, stop_reason

    stop = {"episode_return_mean": 100.0, "env_steps": None, "iterations": None, "wall_s": None}
    early = {RETURN_MEAN_KEY: 150.0, RETURN_WINDOW_KEY: 3, "training_iteration": 1, "num_env_steps_sampled_lifetime": 9}
    assert not StopRule(stop)("t", early)  # three lucky episodes are not "solved"
    assert stop_reason(stop, return_mean=150.0, return_window=3, env_steps=9, iterations=1) is None
    assert StopRule(stop)("t", {**early, RETURN_WINDOW_KEY: 20})
    assert stop_reason({**stop, "iterations": 1}, return_mean=1.0, return_window=0, env_steps=9, iterations=1)


def test_stop_eval_return_mean_only_on_an_evaluated_iteration():
    from trainer.solved import EVAL_RETURN_KEY
    from trainer.stopping import StopRule, stop_reason

    stop = {"episode_return_mean": None, "eval_return_mean": 400.0, "env_steps": None, "iterations": None}
    kw = dict(return_mean=500.0, return_window=20, env_steps=9, iterations=1)
    assert stop_reason(stop, **kw) is None  # the training return does not count for the eval target
    assert stop_reason(stop, **kw, eval_return_mean=float("nan")) is None  # no evaluation in this iteration
    assert stop_reason(stop, **kw, eval_return_mean=420.0).startswith("eval_return_mean 420.0")
    assert StopRule(stop)("t", {EVAL_RETURN_KEY: 400.0, "training_iteration": 3})
    assert not StopRule(stop)("t", {EVAL_RETURN_KEY: float("nan"), "training_iteration": 3})


def test_old_run_state_and_progress_read_as_not_evaluated(tmp_path):
    """A state.json / progress.csv written before evaluation existed still resumes: no eval figures, best judged by
    the training return."""
    from trainer.artifacts import COLUMNS, Progress, latest_eval, read_csv_rows
    from trainer.loop import BestJudge

    run = Storage.open(str(tmp_path))
    old_best = {"checkpoint": "checkpoints/best", "iteration": 2, "env_steps": 20, "episode_return_mean": 30.0}
    run.write_json({"latest_checkpoint": "checkpoints/iter_000002", "iteration": 2, "best": old_best}, "state.json")
    state = RunCheckpoints(run, keep=2).state
    assert state.eval_return_mean is None and state.best == old_best
    old_csv = b"iteration,env_steps,episode_return_mean,episodes,return_window,wall_s,iter_s,env_steps_per_s\n" \
              b"1,10,20.0,1,1,0.5,0.5,20.0\n2,20,30.0,2,2,1.0,0.5,20.0\n"
    rows = read_csv_rows(old_csv)
    assert all(np.isnan(r["eval_return_mean"]) and r["eval_episodes"] == 0 for r in rows) and latest_eval(rows) is None
    # Written back with the eval columns, empty where no evaluation ran; read back the same.
    progress = Progress(str(tmp_path / "p"), rows + [{**rows[-1], "iteration": 3, "eval_return_mean": 480.0,
                                                      "eval_episodes": 10}])
    text = progress.csv_bytes().decode()
    assert text.splitlines()[0].split(",") == COLUMNS and text.splitlines()[1].endswith(",,")
    assert latest_eval(read_csv_rows(text.encode())) == 480.0
    # An old best (judged by the training return) is replaced by the first evaluation, however low.
    judge = BestJudge(evaluation=True, best=old_best)
    row = {"eval_return_mean": float("nan"), "episode_return_mean": 99.0}
    assert judge(row, checkpointed=True, final=True) is None  # no evaluation: not judged
    assert judge({**row, "eval_return_mean": 5.0}, checkpointed=False, final=False) == "eval_return_mean"
    assert judge({**row, "eval_return_mean": 4.0}, checkpointed=True, final=False) is None
    assert judge({**row, "eval_return_mean": 5.0}, checkpointed=False, final=False) == "eval_return_mean"  # ties: newer
    # Evaluation off: the training return of checkpointed iterations, as before.
    judge = BestJudge(evaluation=False, best=old_best)
    assert judge({**row, "episode_return_mean": 31.0}, checkpointed=False, final=False) is None
    assert judge({**row, "episode_return_mean": 31.0}, checkpointed=True, final=False) == "episode_return_mean"
    # A run that ends before its first evaluation: final is best, by the training return.
    assert BestJudge(evaluation=True, best=None)(row, checkpointed=True, final=True) == "episode_return_mean"


def test_policy_loads_from_an_s3_uri_into_a_bounded_cache(s3, tmp_path):
    """A bare RLModule checkpoint uploaded to the local S3 server serves the same actions as the local copy."""
    from make_checkpoint import make_module_checkpoint
    from serving.policy import LoadedPolicy

    local = make_module_checkpoint(tmp_path / "trading", "trading")
    remote = Storage.open(s3.uri("unit/trading"), create=False)
    remote.upload_dir(str(local))
    cache = tmp_path / "cache"
    pol = LoadedPolicy.load("t", remote.location, cache_dir=cache)
    ref = LoadedPolicy.load("ref", str(local))
    obs = np.random.default_rng(0).normal(size=(8,) + ref.observation_space.shape).astype(np.float32)
    assert pol.act(obs) == ref.act(obs) and pol.checkpoint_id == ref.checkpoint_id
    assert pol.checkpoint == remote.location and len(list(cache.iterdir())) == 1
    pol.release()
    assert list(cache.iterdir()) == []

    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="unit/nothing.*does not exist"):
        LoadedPolicy.load("t", s3.uri("unit/nothing"), cache_dir=cache)
    assert time.monotonic() - t0 < 60 and list(cache.iterdir()) == []
    # Secrets given as URI options never reach a message (pyarrow refuses them for S3; other schemes may not).
    with pytest.raises(CheckpointError) as e:
        resolve(s3.uri("unit/trading") + "&secret_key=s3cr3t")
    assert "s3cr3t" not in str(e.value) and "***" in str(e.value)
    # An endpoint nobody listens on: a clear error in bounded time (pyarrow's retries), no hang.
    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="cannot read"):
        resolve("s3://rlp/x?endpoint_override=127.0.0.1:9&scheme=http")
    assert time.monotonic() - t0 < 60
