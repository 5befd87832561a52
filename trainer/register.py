"""`registry.root` set: when the run ends, judge its best checkpoint greedily (rl-eval) and register it.

What a RayJob on the cluster does instead of someone running `rl-eval` + `rl-policy register` by hand: the
evaluation runs on the run's own Ray (on the rollout pool when resources.rollout_resource is set), its record is
written into the checkpoint, and the checkpoint becomes the policy's next version. Promotion stays a decision
(`rl-policy promote`, through the gate): a finished run never moves `champion` by itself.
"""

from __future__ import annotations

from typing import Any

from trainer.errors import TrainerError


def register_run(cfg, checkpoint: str, run_dir: str, log) -> dict[str, Any] | None:
    """-> {name, version, checkpoint, eval} or None when no registry is configured."""
    reg = cfg.registry
    if not reg.root:
        return None
    from rl_checkpoint import CheckpointError
    from rl_checkpoint.registry import Registry, RegistryError
    from rl_eval import EvalError
    from rl_eval.cli import evaluate

    name = reg.name or cfg.experiment
    try:
        rec, _ = evaluate(checkpoint, episodes=reg.eval_episodes, seed=reg.eval_seed, workers=reg.eval_workers,
                          worker_resource=cfg.resources.rollout_resource if reg.eval_workers else None)
        log(f"evaluated {rec.line()}")
        version = Registry.open(reg.root).register(name, checkpoint, run_dir=run_dir)
    except (EvalError, CheckpointError, RegistryError) as e:
        raise TrainerError(f"registry.root={reg.root}: the run finished ({checkpoint}) but was not registered: {e}") from None
    log(f"registered {checkpoint} as {name} version {version.version} in {reg.root}")
    return {"name": name, "version": version.version, "checkpoint": checkpoint, "eval": rec.summary()}
