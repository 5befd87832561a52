"""`python -m trainer [hydra overrides]` / `rl-train`: compose hydra_conf/, build the RLlib job, train, report.

The last stdout line is the run summary as one JSON object (checkpoint, episode_return_mean, env_steps, wall_s).
"""

from __future__ import annotations

import json
import os
import sys
import time

_T0 = time.time()
# Quiet, fast start: no usage-stats reporting thread, no Ray log deduplication delays in the driver.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rl_checkpoint import CheckpointError  # noqa: E402
from trainer.config import register_configs  # noqa: E402
from trainer.errors import TrainerError  # noqa: E402
from trainer.signals import STOP, Stopped  # noqa: E402

register_configs()


def log(msg: str) -> None:
    print(f"[trainer {time.time() - _T0:6.1f}s] {msg}", flush=True)


def write_timeline(path: str) -> None:
    """debug.timeline: a Chrome trace of the Ray tasks and actor calls so far (open in ui.perfetto.dev)."""
    import ray

    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ray.timeline(filename=path)
    log(f"timeline: {path}")


def run(cfg: DictConfig) -> dict:
    """Compose-time checks already passed (types, keys); check values, then train. Returns the summary."""
    from trainer.validate import check_registry_root, default_output_dir, validate

    validate(cfg)
    check_registry_root(cfg)
    from trainer.offline import check_offline_input

    check_offline_input(cfg)  # here, not in validate(): rl-submit validates on a laptop, the log may be a pod path
    if cfg.output_dir is None:
        cfg.output_dir = default_output_dir(cfg)

    from trainer.resources import init_ray, prepare_embedded_ray, set_torch_threads

    prepare_embedded_ray(cfg.resources, log)  # before anything imports ray

    from rl_checkpoint import Storage, redact
    from trainer.artifacts import run_summary
    from trainer.startup import STARTUP

    try:  # the first write: an output_dir the run could never checkpoint into fails now, before Ray starts
        storage = Storage.open(cfg.output_dir)
        storage.write_bytes(OmegaConf.to_yaml(cfg, resolve=True).encode(), "config.yaml")
    except OSError as e:
        raise TrainerError(f"output_dir {redact(cfg.output_dir)} is not writable: {e}") from None
    log(f"experiment {cfg.experiment}: algo={cfg.algo.name} env={cfg.env.name} tune={cfg.tune.scheduler} "
        f"output_dir={storage.location}")

    if cfg.tune.scheduler == "none":
        from trainer.loop import preflight

        preflight(cfg, storage)

    import ray

    started_ray = not ray.is_initialized() and not cfg.resources.address
    t = time.time()
    tune = cfg.tune.scheduler != "none"
    STOP.install(cfg.fault_tolerance.stop_grace_s, tune=tune)
    STARTUP.prewarm(cfg.algo.name, cfg.resources.torch_threads)  # torch/RLlib imports overlap ray.init (trainer.startup)
    init_ray(cfg.resources)
    STARTUP.mark("ray.init")
    STOP.install(cfg.fault_tolerance.stop_grace_s, tune=tune)  # again: ray.init put Ray's C++ handlers in place
    log(f"ray ready in {time.time() - t:.1f}s ({'embedded' if not cfg.resources.address else cfg.resources.address})")
    STARTUP.wait_imports()
    set_torch_threads(cfg.resources.torch_threads)
    try:
        from trainer.capacity import check_capacity

        check_capacity(cfg, log)  # a request Ray can never place fails here, not by waiting for ever
        from trainer.algo import build_algo_config

        if cfg.tune.scheduler == "none":
            from trainer.loop import train_loop

            result = train_loop(cfg, build_algo_config(cfg), storage, log)
        else:
            from trainer.tuning import finish_tune, run_tune

            result = finish_tune(cfg, storage, *run_tune(cfg, build_algo_config, storage, log))
        if cfg.registry.root:  # on the run's Ray, before it shuts down (trainer.register)
            from trainer.register import register_run

            result.extra["registered"] = register_run(cfg, result.best_checkpoint or result.checkpoint,
                                                      storage.location, log)
    finally:
        if cfg.debug.timeline:
            write_timeline(cfg.debug.timeline)
        if started_ray:
            ray.shutdown()
    summary = run_summary(cfg.experiment, storage.location, result, time.time() - _T0)
    summary["startup"] = STARTUP.summary()
    storage.write_json(summary, "summary.json")
    log(f"checkpoint: {summary['checkpoint']}")
    return summary


@hydra.main(config_path="../hydra_conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        summary = run(cfg)
    except (TrainerError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to resume from the latest checkpoint", file=sys.stderr)
        sys.exit(130)
    except Stopped as e:
        STOP.done()
        print(f"trainer: {e}", file=sys.stderr, flush=True)
        sys.exit(e.code)
    STOP.done()
    print(json.dumps(summary), flush=True)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
