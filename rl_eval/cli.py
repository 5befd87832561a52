"""`rl-eval CHECKPOINT`: the greedy policy of a checkpoint over N seeded episodes, recorded in the checkpoint.

    rl-eval outputs/cartpole_ppo                           # a run dir: its latest checkpoint (--select best|final)
    rl-eval outputs/cartpole_ppo/checkpoints/best --episodes 50 --workers 2
    rl-eval s3://bucket/runs/pong/checkpoints/final?endpoint_override=...   # any location the trainer writes
    rl-eval registry:/srv/registry/cartpole@champion        # a registry version (rl-policy)
    rl-eval CKPT --server http://127.0.0.1:8000 --policy cartpole   # the same episodes through the HTTP API
    rl-eval registry:/srv/registry/cartpole@4 --offline s3://logs/cartpole   # off-policy estimate on logged data

Episodes run on Ray workers (an embedded, token-authenticated loopback Ray by default; `--address` for a
cluster, `--worker-resource rollout_pool` to keep them on the rollout pool), or in this process with
`--workers 0`; through a server they run as `--workers` client threads. Episode i resets the env with seed
`--seed + i`. The result (episodes, mean, std, min/max, 95% bootstrap CI of the mean, lengths, seeds, env,
checkpoint id, wall time) is added to the checkpoint as a new record under `evaluations/` (never replacing one;
`--no-record` to only print) and printed: one summary line, or the record as JSON with `--json`.

`--offline LOG` plays nothing: it estimates the greedy policy's return from the complete episodes of a transition
log (a folder or URI of the policy server's Parquet files) by importance sampling (`--method pdis|is`), with a 95%
bootstrap CI, and records it under the checkpoint's `offline_estimates/` and, for a `registry:` reference, in the
version's registry record. The gate never reads it. What the figure means: rl_eval/offline.py.

Exit codes: 0 evaluated; 2 bad input (unknown/unreadable checkpoint or registry ref, a checkpoint for another env,
0 episodes, a server that does not answer or serves another checkpoint, a record that cannot be written); 1 a bug.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

import embedded_ray

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rl-eval", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("checkpoint", help="checkpoint dir, run dir, URI (s3://...), or registry:<root>/<name>@<ref>")
    p.add_argument("--select", choices=("latest", "best", "final"), default="latest",
                   help="which checkpoint of a run dir (default: latest, what the server would load)")
    p.add_argument("--episodes", type=int, default=20, help="greedy episodes (default 20)")
    p.add_argument("--seed", type=int, default=0, help="episode i resets the env with seed SEED+i (default 0)")
    p.add_argument("--workers", type=int, default=1,
                   help="Ray worker tasks (0: in this process); with --server, concurrent client episodes (default 1)")
    p.add_argument("--max-episode-steps", type=int, default=None, help="cut episodes after this many steps")
    p.add_argument("--env", default=None, help="env name, for a bare RLModule checkpoint without metadata")
    p.add_argument("--address", default=None, help="Ray cluster address (default: an embedded Ray)")
    p.add_argument("--worker-resource", default=None, help="Ray custom resource each worker takes (e.g. rollout_pool)")
    p.add_argument("--ray-tmp-dir", default=None, help="temp dir of the embedded Ray")
    p.add_argument("--server", default=None, help="policy server base URL: play through its HTTP API")
    p.add_argument("--policy", default=None, help="the policy's name on --server")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP request to --server (default 10)")
    p.add_argument("--offline", metavar="LOG", default=None,
                   help="estimate off-policy on this transition log (Parquet folder or URI) instead of playing")
    p.add_argument("--method", choices=("pdis", "is"), default="pdis",
                   help="--offline estimator: per-decision (default) or ordinary importance sampling")
    p.add_argument("--no-record", action="store_true", help="print only; do not add a record to the checkpoint")
    p.add_argument("--json", action="store_true", help="print the record as JSON instead of one summary line")
    return p.parse_args(argv)


def _check(a: argparse.Namespace) -> None:
    from rl_eval.episodes import EvalError

    if a.episodes < 1:
        raise EvalError(f"--episodes must be >= 1, got {a.episodes}")
    if a.workers < 0:
        raise EvalError(f"--workers must be >= 0, got {a.workers}")
    if a.max_episode_steps is not None and a.max_episode_steps < 1:
        raise EvalError(f"--max-episode-steps must be >= 1, got {a.max_episode_steps}")
    if (a.server is None) != (a.policy is None):
        raise EvalError("--server and --policy go together (the server's URL and the policy's name on it)")
    if a.server is not None and not a.server.startswith(("http://", "https://")):
        raise EvalError(f"--server must be an http(s):// URL, got {a.server!r}")
    if a.offline is not None and a.server is not None:
        raise EvalError("--offline estimates from a log and plays no episode: it takes no --server")


def target(location: str, select: str = "latest"):
    """-> (resolved Checkpoint, registry Version or None)."""
    from rl_checkpoint import resolve
    from rl_checkpoint.registry import is_registry_ref, resolve_ref

    if is_registry_ref(location):
        version, ckpt = resolve_ref(location)
        return ckpt, version
    return resolve(location, select, base_dir=os.getcwd()), None


def _env_of(ckpt, env_flag: str | None) -> tuple[str, dict[str, Any]]:
    from rl_eval.episodes import EvalError

    meta = ckpt.metadata
    if meta is not None and meta.env:
        if env_flag and env_flag != meta.env:
            raise EvalError(f"checkpoint {ckpt.location} was trained on env {meta.env!r}, not {env_flag!r}")
        return meta.env, dict(meta.env_config)
    if not env_flag:
        raise EvalError(f"checkpoint {ckpt.location} names no env (no rl_platform.json): pass --env")
    import rl_envs

    try:
        return env_flag, rl_envs.merged_config(env_flag, {})
    except KeyError as e:
        raise EvalError(str(e.args[0])) from None


def start_ray(address: str | None, ray_tmp_dir: str | None) -> bool:
    """Connect to `address`, or start an embedded Ray (token auth, loopback). Returns whether we started it."""
    from rl_eval.episodes import EvalError

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return False  # inside a process that already runs Ray (the trainer): use it as it is
    if address is None:
        embedded_ray.configure("token")
    import ray

    kw: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
    if address is None:
        kw.update(include_dashboard=False, num_gpus=0, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
                  _system_config={"enable_worker_prestart": False})
        if ray_tmp_dir:
            kw["_temp_dir"] = os.path.abspath(ray_tmp_dir)
    try:
        if address is None:
            embedded_ray.init_local(**kw)
        else:
            ray.init(address=address, **kw)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
        raise EvalError(f"cannot start or reach Ray at {address or 'an embedded Ray'!r}: "
                        f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
    except Exception as e:  # Ray raises a bare Exception when its own raylet does not register within 30 s
        msg = embedded_ray.start_failure(e)
        if msg is None:
            raise
        raise EvalError(msg) from None
    return True


def evaluate(location: str, *, episodes: int = 20, seed: int = 0, workers: int = 1, select: str = "latest",
             max_episode_steps: int | None = None, env: str | None = None, address: str | None = None,
             worker_resource: str | None = None, ray_tmp_dir: str | None = None, server: str | None = None,
             policy: str | None = None, timeout_s: float = 10.0, record: bool = True):
    """The library form of `rl-eval`: -> (EvalRecord, where it was written or None). Raises EvalError/CheckpointError."""
    from rl_checkpoint import CheckpointError, EvalRecord, write_eval_record
    from rl_eval import episodes as ep

    ckpt, _ = target(location, select)
    env_name, env_config = _env_of(ckpt, env)
    seeds = [seed + i for i in range(episodes)]
    load_from = ckpt.storage.uri()  # not redacted: workers need the URI's credentials
    t0 = time.time()
    extra: dict[str, Any] = {}
    if server is not None:
        client = ep.ServerClient(server, policy, timeout_s)
        served = client.info.get("checkpoint_id")
        if served != ckpt.checkpoint_id:
            raise ep.EvalError(f"policy {policy!r} on {server} serves checkpoint {served!r}, not "
                               f"{ckpt.checkpoint_id!r} ({ckpt.location}): evaluate the checkpoint it serves")
        played = ep.play_through_server(client, env_name, env_config, seeds, max_episode_steps, workers)
        extra.update(mode="server", server=server, policy=policy)
    elif workers == 0:
        played = ep.play_local(load_from, env_name, env_config, seeds, max_episode_steps)
    else:
        started = start_ray(address, ray_tmp_dir)
        try:
            played = ep.play_on_ray(load_from, env_name, env_config, seeds, max_episode_steps, workers,
                                    {worker_resource: 1} if worker_resource else None)
        finally:
            if started:
                import ray

                ray.shutdown()
    played = sorted(played, key=lambda e: e.seed)
    rec = EvalRecord.from_episodes(
        checkpoint_id=ckpt.checkpoint_id, env=env_name, returns=[e.ret for e in played],
        lengths=[e.length for e in played], seeds=[e.seed for e in played], wall_s=time.time() - t0,
        env_config=env_config, checkpoint=ckpt.location, max_episode_steps=max_episode_steps, **extra)
    try:
        where = write_eval_record(ckpt.storage, rec) if record else None
    except CheckpointError as e:  # a read-only checkpoint, a store gone meanwhile: keep the figures in the message
        raise ep.EvalError(f"{e} (rerun with --no-record to only print); evaluated: {rec.line()}") from None
    return rec, where


def main(argv: Sequence[str] | None = None) -> int:
    from rl_checkpoint import CheckpointError
    from rl_eval.episodes import EvalError

    a = _args(argv)
    try:
        _check(a)
        if a.offline is not None:
            from rl_eval.offline import estimate

            rec, where, version = estimate(a.checkpoint, a.offline, method=a.method, select=a.select, env=a.env,
                                           record=not a.no_record)
            if version is not None:
                print(f"rl-eval: recorded in the registry: {version.name} v{version.version}", file=sys.stderr)
        else:
            rec, where = evaluate(a.checkpoint, episodes=a.episodes, seed=a.seed, workers=a.workers, select=a.select,
                                  max_episode_steps=a.max_episode_steps, env=a.env, address=a.address,
                                  worker_resource=a.worker_resource, ray_tmp_dir=a.ray_tmp_dir, server=a.server,
                                  policy=a.policy, timeout_s=a.timeout, record=not a.no_record)
    except (EvalError, CheckpointError) as e:  # RegistryError is a CheckpointError
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was recorded", file=sys.stderr)
        return 130
    if where:
        print(f"rl-eval: recorded {where}", file=sys.stderr, flush=True)
    print(json.dumps(rec.to_json()) if a.json else rec.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
