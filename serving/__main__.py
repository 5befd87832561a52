"""`python -m serving`: serve policies from checkpoints on an embedded Ray (what `make serve` runs).

Examples:
  python -m serving --checkpoint outputs/cartpole_ppo/checkpoints/final
  python -m serving --policy cartpole=outputs/cartpole_ppo/checkpoints/final --policy pong=outputs/pong_ppo/checkpoints/final
  python -m serving --checkpoint 's3://bucket/runs/cartpole?endpoint_override=minio:9000&scheme=http'  (a run: its latest)
Send SIGHUP to re-read the config and checkpoints (a zero-downtime reload); a changed --config file is applied
by itself too (its content is polled about once a second; --no-watch turns that off). Ctrl-C stops.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
import time

from serving import launch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(launch.DEFAULT_CONFIG), help="Serve config (default: %(default)s)")
    p.add_argument("--checkpoint", help="checkpoint (path or URI) of the config's first policy (overrides the config)")
    p.add_argument("--policy", action="append", default=[], metavar="NAME=CHECKPOINT",
                   help="serve these policies instead of the config's (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port clients use (default: %(default)s)")
    p.add_argument("--proxy-port", type=int, default=None, help="classic Serve proxy port in direct mode (default: port+500)")
    p.add_argument("--ingress", choices=launch.INGRESS_MODES, default="direct",
                   help="direct: the replica answers on --port (~1 ms/request); proxy: Serve's classic proxy on "
                        "--port (~9 ms/request); see serving/README.md (default: %(default)s)")
    p.add_argument("--num-replicas", type=int, default=None)
    p.add_argument("--max-batch-size", type=int, default=None, help="override user_config.max_batch_size")
    p.add_argument("--metrics-port", type=int, default=8080, help="Ray metrics export port (default: %(default)s)")
    p.add_argument("--temp-dir", default=None, help="Ray temp dir (default: Ray's)")
    p.add_argument("--address", default=None, help="connect to this Ray cluster instead of starting one")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--ray-auth", choices=("token", "disabled"), default="token",
                   help="token authentication on the embedded Ray (default: %(default)s); 'disabled' lets any "
                        "local process run code through Ray. Ignored with --address.")
    p.add_argument("--ready-timeout", type=float, default=180.0)
    p.add_argument("--no-watch", dest="watch", action="store_false",
                   help="do not apply a changed --config file by itself (SIGHUP still reloads)")
    return p.parse_args(argv)


WATCH_INTERVAL_S = 0.5  # a change is applied once the file has read the same on two polls in a row


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _config(args: argparse.Namespace, revision: str | None = None) -> dict:
    policies = {}
    for item in args.policy:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise launch.LaunchError(f"--policy expects NAME=CHECKPOINT, got {item!r}")
        policies[name] = path
    uc = {} if args.max_batch_size is None else {"max_batch_size": args.max_batch_size}
    if revision:
        uc["revision"] = revision  # a SIGHUP always re-reads checkpoints, even at unchanged paths
    return launch.with_overrides(launch.load_config(args.config), checkpoint=args.checkpoint,
                                 policies=policies or None, user_config=uc, num_replicas=args.num_replicas)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_digest = _digest(args.config)
    try:
        cfg = _config(args)
    except launch.LaunchError as e:
        launch.print_err(str(e))
        return 2
    stop, reload = threading.Event(), threading.Event()
    try:
        base = launch.start(cfg, host=args.host, port=args.port, proxy_port=args.proxy_port, ingress=args.ingress,
                            metrics_port=args.metrics_port, temp_dir=args.temp_dir, address=args.address,
                            num_cpus=args.num_cpus, ready_timeout_s=args.ready_timeout,
                            ray_auth=args.ray_auth)
        # Installed after ray.init, which sets its own handlers.
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGHUP, lambda *_: reload.set())
        pols = launch.policy_deployment(cfg)["user_config"]["policies"]
        first = next(iter(pols))
        print(f"serving {', '.join(pols)} at {base}  (metrics: http://127.0.0.1:{args.metrics_port}/metrics)", flush=True)
        print(f"  curl -s {base}/v1/policies/{first}/act -H 'Content-Type: application/json' "
              f"-d '{{\"observation\": [0.0, 0.0, 0.0, 0.0]}}'", flush=True)
        print(json.dumps({"event": "ready", "url": base, "policies": list(pols), "watch": args.watch}), flush=True)
        # The config file's content as last applied / last tried, and a change seen once (applied when it reads
        # the same on the next poll: a writer that does not replace the file atomically is not caught halfway).
        applied = attempted = pending = started_digest
        while not stop.wait(WATCH_INTERVAL_S):
            trigger = None
            if reload.is_set():
                reload.clear()
                trigger = "sighup"
            elif args.watch:
                d = _digest(args.config)
                if d is not None and d not in (applied, attempted):
                    if d == pending:
                        trigger = "config_changed"
                    pending = d
            if trigger is None:
                continue
            attempted = pending = _digest(args.config)
            try:
                cfg = _config(args, revision=f"sighup-{time.time():.3f}" if trigger == "sighup" else None)
                launch.deploy(cfg, base_url=base)
                applied = attempted
                print(json.dumps({"event": "reloaded", "url": base, "trigger": trigger}), flush=True)
            except launch.LaunchError as e:
                launch.print_err(f"reload failed, still serving the previous checkpoint: {e}")
                print(json.dumps({"event": "reload_failed", "error": str(e), "trigger": trigger}), flush=True)
        return 0
    except launch.LaunchError as e:
        launch.print_err(str(e))
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        launch.shutdown()


if __name__ == "__main__":
    sys.exit(main())
