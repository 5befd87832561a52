"""`python -m trainer.diagnose [--address ADDR] [--all]`: where did every env runner and learner land?

Answers "learner on the wrong node" from Ray's state API: one line per actor (role, state, node, the node's pool
resources) and WRONG POOL when an actor runs on a node that does not advertise the pool it asked for, or a learner
that wanted a GPU sits on a node without one. Exit 1 when anything is misplaced; 2 when Ray cannot be reached.
Needs a Ray with its dashboard (KubeRay heads run one; locally `ray start --head --include-dashboard=true`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

POOLS = ("rollout_pool", "learner_pool")


def role(actor: dict[str, Any]) -> str | None:
    """RLlib's actors by what they ask for: env runners are named, learners run as Ray Train workers."""
    name = actor.get("class_name") or ""
    req = actor.get("required_resources") or {}
    if "EnvRunner" in name:
        return "env_runner"
    if "learner_pool" in req or "_WrappedExecutable" in name or "Learner" in name:
        return "learner"
    return None


def misplaced(actor: dict[str, Any], node: dict[str, Any] | None) -> str | None:
    """Why this actor is on the wrong node, or None."""
    if node is None:
        return "on no known node"
    req = actor.get("required_resources") or {}
    total = node.get("resources_total") or {}
    for pool in POOLS:
        if pool in req and pool not in total:
            return f"asked for {pool} but node {node.get('node_ip')} does not advertise it"
    if role(actor) == "learner" and req.get("GPU") and "GPU" not in total:
        return f"asked for a GPU but node {node.get('node_ip')} has none"
    if role(actor) == "learner" and any(p in total for p in POOLS) and "learner_pool" not in total:
        return f"runs on node {node.get('node_ip')} outside the learner pool (set resources.learner_resource)"
    return None


def report(actors: list[dict[str, Any]], nodes: list[dict[str, Any]], include_dead: bool) -> tuple[list[str], int]:
    by_id = {n["node_id"]: n for n in nodes}
    lines, bad = [], 0
    for a in actors:
        r = role(a)
        if r is None or (a.get("state") == "DEAD" and not include_dead):
            continue
        node = by_id.get(a.get("node_id"))
        pools = ",".join(p for p in (*POOLS, "GPU") if p in ((node or {}).get("resources_total") or {})) or "-"
        why = misplaced(a, node)
        bad += why is not None
        where = (node or {}).get("node_ip", "?")
        lines.append(f"{r:10s} {a.get('state', '?'):8s} pid {a.get('pid') or '-':>7} node {where} [{pools}] "
                     + (f"WRONG POOL: {why}" if why else "ok"))
    return lines, bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.diagnose", description=__doc__.splitlines()[0])
    ap.add_argument("--address", default=None, help="Ray GCS address (default: RAY_ADDRESS or the local head)")
    ap.add_argument("--all", action="store_true", help="include dead actors (finished or crashed runs)")
    args = ap.parse_args(argv)

    import os

    from ray.util.state import list_actors, list_nodes

    from trainer.errors import TrainerError
    from trainer.resources import check_reachable

    try:
        address = args.address or os.environ.get("RAY_ADDRESS")
        if address:
            check_reachable(address)  # Ray's own client retries an unreachable GCS for half a minute
    except TrainerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        actors = [a.__dict__ if hasattr(a, "__dict__") else dict(a)
                  for a in list_actors(address=args.address, detail=True, limit=10000, raise_on_missing_output=False)]
        nodes = [n.__dict__ if hasattr(n, "__dict__") else dict(n)
                 for n in list_nodes(address=args.address, detail=True, limit=10000, raise_on_missing_output=False)]
    except Exception as e:  # ConnectionError, a missing dashboard, an HTTP error: one line, no traceback
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"error: cannot read Ray's state (is Ray running with its dashboard?): {first}", file=sys.stderr)
        return 2
    lines, bad = report(actors, nodes, args.all)
    print("\n".join(lines) if lines else "no env runner or learner actors" + ("" if args.all else " alive (try --all)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
