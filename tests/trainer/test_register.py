"""registry.root: the trainer evaluates its best checkpoint greedily when the run ends and registers it."""

import pytest

from rl_checkpoint import BEST, checkpoint_rel, read_eval_records, resolve
from rl_checkpoint.registry import Registry
from trainer_helpers import run_trainer, summary_of

pytestmark = pytest.mark.slow


def test_finished_run_is_evaluated_and_registered_but_not_promoted(tmp_path):
    out, root = tmp_path / "run", tmp_path / "registry"
    proc = run_trainer(f"output_dir={out}", "stop.iterations=2", f"registry.root={root}", "registry.name=cp",
                       "registry.eval_episodes=4", "registry.eval_workers=0", "registry.eval_seed=3")
    reg = summary_of(proc)["registered"]
    best = resolve(str(out / checkpoint_rel(BEST)))
    assert reg["name"] == "cp" and reg["version"] == 1 and reg["checkpoint"] == str(out / checkpoint_rel(BEST)), reg
    records = read_eval_records(best.storage)
    assert [r.eval_id for r in records] == [reg["eval"]["eval_id"]]
    assert records[0].seeds == [3, 4, 5, 6] and records[0].checkpoint_id == best.checkpoint_id
    version = Registry(str(root)).get("cp", 1)
    assert version.checkpoint_id == best.checkpoint_id and version.run_dir == str(out), version
    assert "champion" not in version.aliases  # promotion is a decision, through the gate
