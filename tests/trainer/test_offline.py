"""`python -m trainer algo=bc|marwil offline.input=...` as a user runs it: bad input is one `error:` line and exit 2
before Ray starts; a real run from a log on S3 trains, counts offline env steps as transitions trained on, stops on
stop.iterations, evaluates greedily and registers its checkpoint like an online run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from offline_logs import row, write_rows
from trainer_helpers import run_trainer, short_tmp, summary_of


def _log(folder: Path, episodes: int = 4, steps: int = 20) -> Path:
    rng = np.random.default_rng(0)
    rows = [row(f"e{i}", t, rng.uniform(-0.05, 0.05, 4), int(rng.integers(2)), done=t == steps - 1)
            for i in range(episodes) for t in range(steps)]
    write_rows(folder / "cartpole" / "part-00000.parquet", rows)
    return folder


@pytest.mark.parametrize("case, needle", [
    ("no_input", "error: algo=bc trains from logged transitions: give offline.input="),
    ("online_algo", "error: offline.input is for algo=bc or algo=marwil; algo=ppo trains online"),
    ("missing", "does not exist"),
    ("empty", "holds no .parquet files"),
    ("wrong_env", "env 'trading' emits shape"),
])
def test_bad_offline_input_is_one_line_exit_2_before_ray(tmp_path, case, needle):
    log = _log(tmp_path / "log")
    (tmp_path / "empty").mkdir()
    overrides = {
        "no_input": ["algo=bc"],
        "online_algo": ["algo=ppo", f"offline.input={log}"],
        "missing": ["algo=bc", f"offline.input={tmp_path / 'nowhere'}"],
        "empty": ["algo=marwil", f"offline.input={tmp_path / 'empty'}"],
        "wrong_env": ["algo=bc", "env=trading", f"offline.input={log}"],
    }[case]
    ray_tmp = short_tmp()
    proc = run_trainer("~experiment", *overrides, f"output_dir={tmp_path / 'out'}", f"resources.ray_tmp_dir={ray_tmp}",
                       check=False, timeout=120)
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(err) == 1 and needle in err[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "ray ready" not in proc.stdout
    assert not list(Path(ray_tmp).glob("session_*"))


@pytest.mark.slow
def test_marwil_from_a_log_on_s3_trains_evaluates_and_registers(s3, tmp_path):
    from rl_checkpoint import Storage
    from rl_checkpoint.registry import Registry

    uri = s3.uri("offline/run")
    Storage.open(uri, create=False).upload_dir(str(_log(tmp_path / "log")))
    registry = tmp_path / "registry"
    proc = run_trainer("~experiment", "algo=marwil", f"offline.input='{uri}'", f"output_dir={tmp_path / 'out'}",
                       "stop.iterations=2", "offline.updates_per_iteration=3", "algo.train_batch_size=32",
                       "evaluation.interval=1", "evaluation.episodes=2", f"registry.root={registry}",
                       "registry.eval_episodes=2", "registry.eval_workers=0", timeout=600)
    summary = summary_of(proc)
    # Two iterations of 3 updates of 32 logged transitions; no env stepped for training, so no training return.
    assert summary["iterations"] == 2 and summary["env_steps"] == 2 * 3 * 32
    assert summary["stop_reason"] == "iterations 2 >= 2" and summary["episode_return_mean"] is None
    assert summary["eval_return_mean"] is not None and summary["best_checkpoint"]
    version = Registry.open(str(registry)).get("cartpole_marwil", 1)
    assert version.env == "cartpole" and version.eval_records[-1].episodes == 2
