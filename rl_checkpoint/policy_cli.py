"""rl-policy: the policy registry from the command line (rl_checkpoint.registry; the gate is rl_checkpoint.gate).

    rl-policy [--registry ROOT] register NAME CHECKPOINT [--select latest|best|final]
    rl-policy list [NAME] [--json]
    rl-policy show NAME[@VERSION|@ALIAS] [--json]          default @champion
    rl-policy alias NAME ALIAS VERSION
    rl-policy promote NAME VERSION [--min-return R] [--force REASON] [--dry-run]
    rl-policy rollback NAME
    rl-policy history NAME [--json]

ROOT is a folder or s3://bucket/prefix[?endpoint_override=HOST:PORT&scheme=http...]; without --registry,
$RL_REGISTRY. `register` creates a local root whose parent exists; every other command needs an existing one.
The policy server and rl-eval name a version as registry:<ROOT>/<NAME>[@VERSION|@ALIAS][?ROOT's URI options].

Exit codes: 0 done; 2 bad input or refused, one line on stderr naming the problem (unknown policy, version or alias;
a registry root that does not exist, cannot be reached or cannot be written; an unreadable checkpoint, one for
another env, or one rewritten since registration; a promotion refused by the gate, naming its rule and figures;
`promote --dry-run` of a version the gate refuses); 3 the registry stayed busy with other writers (retry).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_INVALID, EXIT_BUSY = 0, 2, 3


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--registry", metavar="ROOT", default=argparse.SUPPRESS,
                        help="registry root: a folder or s3://bucket/prefix (default: $RL_REGISTRY)")
    p = argparse.ArgumentParser(prog="rl-policy", parents=[common], description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("register", parents=[common], help="add a checkpoint as the policy's next version")
    c.add_argument("name", metavar="NAME")
    c.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint, RLModule or run directory (path or URI)")
    c.add_argument("--select", default="latest", choices=("latest", "best", "final"),
                   help="which checkpoint of a run directory (default: latest)")
    c.add_argument("--json", action="store_true", help="print the version as JSON")

    c = sub.add_parser("list", parents=[common], help="the policies, or one policy's versions")
    c.add_argument("name", metavar="NAME", nargs="?")
    c.add_argument("--json", action="store_true")

    c = sub.add_parser("show", parents=[common], help="one version (default: the champion)")
    c.add_argument("ref", metavar="NAME[@VERSION|@ALIAS]")
    c.add_argument("--json", action="store_true")

    c = sub.add_parser("alias", parents=[common], help="point ALIAS at VERSION")
    c.add_argument("name", metavar="NAME")
    c.add_argument("alias", metavar="ALIAS")
    c.add_argument("version", metavar="VERSION", help="a version number or another alias")

    c = sub.add_parser("promote", parents=[common], help="make VERSION the champion if the gate allows it")
    c.add_argument("name", metavar="NAME")
    c.add_argument("version", metavar="VERSION", help="a version number or an alias")
    c.add_argument("--min-return", type=float, default=None, metavar="R",
                   help="floor for the lower end of the evaluation's 95%% CI (default: the env's solved return)")
    c.add_argument("--force", metavar="REASON", default=None,
                   help="promote even if the gate refuses; REASON is recorded in the registry")
    c.add_argument("--dry-run", action="store_true", help="print the gate's decision, change nothing")
    c.add_argument("--json", action="store_true")

    c = sub.add_parser("rollback", parents=[common], help="make the previous champion the champion again")
    c.add_argument("name", metavar="NAME")

    c = sub.add_parser("history", parents=[common], help="the policy's event log")
    c.add_argument("name", metavar="NAME")
    c.add_argument("--json", action="store_true")
    return p


def _eval_text(v) -> str:
    if not v.eval_records:
        return "no evaluation at registration"
    r = v.eval_records[-1]
    return f"mean {r.mean:.2f} ± {r.std:.2f} (95% CI {r.ci95[0]:.2f}..{r.ci95[1]:.2f}, n={r.episodes}, {r.created})"


def _estimate_text(v) -> str | None:
    """The newest off-policy estimate (rl-eval --offline), beside the online evaluation; the gate ignores it."""
    if not v.offline_estimates:
        return None
    e = v.offline_estimates[-1]
    return (f"{e['method']} estimate {e['mean']:.2f} (95% CI {e['ci95'][0]:.2f}..{e['ci95'][1]:.2f}, "
            f"n={len(e['estimates'])} logged episodes, agreement {e['agreement']:.1%}, logging policy "
            f"{e['behaviour']} returned {e['behaviour_return_mean']:.2f}; {e['data']}, {e['created']})")


def _show(v) -> str:
    from rl_checkpoint import redact

    rows = [("checkpoint", f"{redact(v.checkpoint)} (id {v.checkpoint_id})"), ("env", v.env),
            ("eval", _eval_text(v)), ("offline", _estimate_text(v)),
            ("run", v.run_dir and redact(v.run_dir)), ("config", v.config_hash),
            ("git", v.git_commit), ("created", f"{v.created} by {v.registered_by}")]
    rows += [(k, json.dumps(val)) for k, val in sorted(v.extra.items())]
    head = f"{v.name} v{v.version}" + (f"  [{', '.join(v.aliases)}]" if v.aliases else "")
    return "\n".join([head] + [f"  {k:<10}  {val if val is not None else '-'}" for k, val in rows])


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def run(args: argparse.Namespace) -> int:
    from rl_checkpoint import redact
    from rl_checkpoint.errors import RegistryError
    from rl_checkpoint.registry import Registry

    reg = Registry.open(getattr(args, "registry", None))
    cmd = args.command
    if cmd == "register":
        try:
            before = {v.version for v in reg.versions(args.name)}
        except RegistryError:  # a new policy, or a root register creates
            before = set()
        v = reg.register(args.name, args.checkpoint, select=args.select)
        if args.json:
            _print_json(v.to_json())
        else:
            what = "already registered as" if v.version in before else "registered"
            print(f"{what} {v.name} v{v.version}: {redact(v.checkpoint)} ({v.env}; {_eval_text(v)})")
            if not v.eval_records:
                print(f"note: {v.name} v{v.version} has no evaluation yet; promote refuses it until one is written",
                      file=sys.stderr)
    elif cmd == "list" and args.name is None:
        names = reg.names()
        rows = {n: reg.aliases(n) for n in names}
        if args.json:
            _print_json({n: {"aliases": a, "versions": a.get("latest")} for n, a in rows.items()})
        for n, a in rows.items() if not args.json else ():
            champ = f"champion v{a['champion']}" if "champion" in a else "no champion"
            print(f"{n}  {a.get('latest', 0)} versions, {champ}")
    elif cmd == "list":
        versions = reg.versions(args.name)
        if args.json:
            _print_json([v.to_json() for v in versions])
        else:
            for v in versions:
                r = v.eval_records[-1] if v.eval_records else None
                ev = f"{r.mean:8.2f} [{r.ci95[0]:.2f}..{r.ci95[1]:.2f}] n={r.episodes}" if r else "no eval"
                print(f"v{v.version:<4} {','.join(v.aliases) or '-':<24} {ev:<36} {v.created}  {redact(v.checkpoint)}")
    elif cmd == "show":
        name, _, ref = args.ref.partition("@")
        v = reg.get(name, ref or "champion")
        _print_json(v.to_json()) if args.json else print(_show(v))
    elif cmd == "alias":
        v = reg.set_alias(args.name, args.alias, args.version)
        print(f"{v.name}@{args.alias} -> v{v.version}")
    elif cmd == "promote":
        if args.dry_run:
            d = reg.gate(args.name, args.version, min_return=args.min_return)
            _print_json(d.to_json()) if args.json else print(d.message)
            return EXIT_OK if d.allowed else EXIT_INVALID
        res = reg.promote(args.name, args.version, min_return=args.min_return, force_reason=args.force)
        if args.json:
            _print_json({"name": res.name, "champion": res.version, "previous": res.previous, "forced": res.forced,
                         "force_reason": res.force_reason, "gate": res.decision.to_json(), "seq": res.seq})
        else:
            how = f"FORCED ({res.force_reason}) over {res.decision.message}" if res.forced else res.decision.message
            print(f"{res.name}: champion v{res.version}, previous {'v%d' % res.previous if res.previous else '-'}; "
                  f"{how}")
    elif cmd == "rollback":
        res = reg.rollback(args.name)
        print(f"{res.name}: champion v{res.version}, previous {'v%d' % res.previous if res.previous else '-'} "
              f"({res.decision.message})")
    elif cmd == "history":
        events = reg.history(args.name)
        for ev in events:
            if ev["type"] == "register":
                ev["record"]["checkpoint"] = redact(ev["record"]["checkpoint"])
        if args.json:
            _print_json(events)
        for ev in events if not args.json else ():
            what = {"register": lambda e: f"v{e['version']} {redact(e['record']['checkpoint'])}",
                    "alias": lambda e: f"{e['alias']} -> v{e['version']}",
                    "promote": lambda e: f"v{e['version']} (from {'v%d' % e['from'] if e['from'] else '-'})"
                    + (f" FORCED: {e['force_reason']}" if e.get("forced") else ""),
                    "rollback": lambda e: f"v{e['version']} (from v{e['from']})",
                    "estimate": lambda e: f"v{e['version']} offline {e['estimate']['method']} "
                    f"{e['estimate']['mean']:.2f} on {e['estimate']['data']}"}[ev["type"]](ev)
            print(f"{ev['seq']:>4}  {ev['time']}  {ev['by']:<24} {ev['type']:<9} {what}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rl_checkpoint.errors import CheckpointError

    try:
        return run(args)
    except CheckpointError as e:  # RegistryError, or a checkpoint that cannot be resolved or read
        print("error: " + " ".join(str(e).split()), file=sys.stderr)  # one line, whatever a storage error held
        return getattr(e, "exit_code", EXIT_INVALID)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
