"""rl-rollout: progressive delivery of a policy: canary (split) or shadow traffic, judged on live figures, then
promoted or rolled back. The desired state lives in the Serve config (policies.NAME.candidate, with the rollout's
state in candidate.rollout), never only in this process.

    rl-rollout start NAME CANDIDATE TARGET [FIGURES] [--steps 5,25,50,100] [--interval S] [--min-episodes N]
               [--min-requests N] [--max-error-ratio R] [--max-p99-ms T] [--max-hold N] [--mode split|shadow]
               [--min-agreement A] [--drain-timeout S] [--apply-timeout S] [--detach] [--resume]
    rl-rollout resume NAME TARGET [FIGURES]        continue a rollout from the state in the config
    rl-rollout status NAME TARGET [--json]         one line: status, step, weight, last decision and its figures
    rl-rollout abort NAME TARGET [--reason TEXT]   remove the candidate now (a running controller stops)

TARGET (one): --config FILE --server URL   the Serve config `python -m serving --config FILE` serves (rewritten
                                            atomically; the server applies it; confirmed through URL)
              --rayservice NAME [-n NS] [--kubeconfig F] [--context C] [--server URL]
                                            the RayService's spec.serveConfigV2, patched alone (KubeRay updates the
                                            Serve app in place); confirmed by KubeRay's status and URL when given
FIGURES:      --server URL (default)        GET URL/v1/policies/NAME/stats
              --prometheus URL [--prom-selector 'namespace="rl"']   the ray_rl_serve_* series, summed over replicas

Each interval the judge (rl_rollout.judge) rolls back on the candidate's error ratio, p99, or a lower mean
episode return (one-sided Welch test at 95% once --min-episodes episodes ended on each side), holds while the
data are too few (pausing after --max-hold intervals), pauses while the figures are unavailable (retrying every
interval, never promoting on missing data), else advances to the next step; a healthy interval at 100% promotes:
the champion's sticky sessions drain (--drain-timeout), champion := candidate, and a registry candidate's
version becomes the registry's champion (forced with the rollout's reason when the offline gate refuses).
Shadow mode mirrors a share of the champion's requests to the candidate (no client sees it): errors, p99 and
action agreement are judged (agreement only with --min-agreement); it never promotes: at 100% it completes,
removes the candidate and says so: start a split rollout next.

Exit codes: 0 promoted, completed (shadow), started with --detach, status, abort; 2 bad input, one line `error:`;
3 rolled back (the reason in the line, including a candidate that failed to load); 4 paused (held too long, or
the config change was not applied in time; resume or abort); 5 aborted by `rl-rollout abort` while running;
130 Ctrl-C (the rollout stays in the config at its step; `resume` continues).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rl_rollout.errors import EXIT_INTERRUPTED, EXIT_OK, RolloutError

COMMANDS = ("start", "resume", "status", "abort")


def _positive(kind: type, flag: str, allow_zero: bool = False):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r} is not a{'n integer' if kind is int else ' number'}")
        if (isinstance(v, float) and not math.isfinite(v)) or v < 0 or (v == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"{flag} must be {'>= 0' if allow_zero else '> 0'}, got {text}")
        return v
    return parse


def _ratio(flag: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r} is not a number")
        if not 0.0 <= v <= 1.0:
            raise argparse.ArgumentTypeError(f"{flag} must be in [0, 1], got {text}")
        return v
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse, but bad input is one line `error: ...` and exit 2 (the project's CLI convention)."""

    def error(self, message: str):
        raise RolloutError(f"{self.prog}: {message}")


def _target_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target (one of --config or --rayservice)")
    g.add_argument("--config", metavar="FILE", help="the Serve config a local `python -m serving --config FILE` serves")
    g.add_argument("--rayservice", metavar="NAME", help="a KubeRay RayService (its spec.serveConfigV2)")
    g.add_argument("-n", "--namespace", help="RayService namespace (default: the kubeconfig context's, else default)")
    g.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster in a pod)")
    g.add_argument("--context", help="kubeconfig context (default: the current one)")
    g.add_argument("--server", metavar="URL", help="the policy server (required with --config): confirms changes; "
                                                   "the figures source unless --prometheus")


def _figures_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("figures")
    g.add_argument("--prometheus", metavar="URL", help="read the figures from Prometheus's HTTP API")
    g.add_argument("--prom-selector", metavar="MATCHERS", help="extra label matchers, e.g. 'namespace=\"rl\"'")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rl-rollout", description=__doc__.split("\n\n")[0],
                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("start", help="start a rollout and drive it to promotion or rollback")
    c.add_argument("name", metavar="NAME", help="the policy name in the config")
    c.add_argument("candidate", metavar="CANDIDATE", help="checkpoint path, URI or registry:<root>/<name>@<version|alias>")
    _target_flags(c)
    _figures_flags(c)
    c.add_argument("--steps", default="5,25,50,100", help="candidate share per step, percent (default: %(default)s)")
    c.add_argument("--interval", type=_positive(float, "--interval"), default=60.0, metavar="S",
                   help="analysis interval in seconds (default: %(default)s)")
    c.add_argument("--min-episodes", type=_positive(int, "--min-episodes"), default=30, metavar="N",
                   help="ended episodes per version before returns are compared (default: %(default)s, at least 2)")
    c.add_argument("--min-requests", type=_positive(int, "--min-requests"), default=20, metavar="N",
                   help="candidate requests per step before errors and p99 are judged and before it advances "
                        "(default: %(default)s)")
    c.add_argument("--max-error-ratio", type=_ratio("--max-error-ratio"), default=0.05, metavar="R",
                   help="roll back above this candidate error ratio (default: %(default)s)")
    c.add_argument("--max-p99-ms", type=_positive(float, "--max-p99-ms"), default=500.0, metavar="T",
                   help="roll back above this candidate p99 latency (default: %(default)s)")
    c.add_argument("--max-hold", type=_positive(int, "--max-hold"), default=10, metavar="N",
                   help="intervals a step may wait for enough data before the rollout pauses (default: %(default)s)")
    c.add_argument("--mode", choices=("split", "shadow"), default="split",
                   help="split: the candidate answers a share of new sessions; shadow: it sees a share of the "
                        "champion's requests, answers none, never promotes (default: %(default)s)")
    c.add_argument("--min-agreement", type=_ratio("--min-agreement"), default=None, metavar="A",
                   help="shadow: roll back when the candidate agrees with the champion on fewer actions")
    c.add_argument("--drain-timeout", type=_positive(float, "--drain-timeout", True), default=120.0, metavar="S",
                   help="before promoting, wait this long at most for the champion's sessions to end (default: %(default)s)")
    c.add_argument("--apply-timeout", type=_positive(float, "--apply-timeout"), default=180.0, metavar="S",
                   help="wait this long at most for the server to apply a config change (default: %(default)s)")
    c.add_argument("--detach", action="store_true", help="write the first step and return (resume drives it)")
    c.add_argument("--resume", action="store_true", help="if a rollout of NAME is running, continue it instead")
    c.add_argument("--json", action="store_true", help="print the final record as JSON")

    c = sub.add_parser("resume", help="continue a rollout from the state in the config")
    c.add_argument("name", metavar="NAME")
    _target_flags(c)
    _figures_flags(c)
    c.add_argument("--json", action="store_true")

    c = sub.add_parser("status", help="one line: the rollout's status, step, weight and last decision")
    c.add_argument("name", metavar="NAME")
    _target_flags(c)
    c.add_argument("--json", action="store_true")

    c = sub.add_parser("abort", help="remove the candidate now; the champion serves alone")
    c.add_argument("name", metavar="NAME")
    _target_flags(c)
    c.add_argument("--reason", default=None, help="recorded with the rollout")
    return p


# ---------------------------------------------------------------------------------------------- wiring
def make_target(args) -> Any:
    from rl_rollout import targets

    if bool(args.config) == bool(args.rayservice):
        raise RolloutError("give one target: --config FILE (with --server URL) or --rayservice NAME")
    if args.config:
        if args.namespace or args.kubeconfig or args.context:
            raise RolloutError("--namespace/--kubeconfig/--context go with --rayservice, not --config")
        return targets.LocalFile(args.config)
    return targets.RayService(args.rayservice, args.namespace, args.kubeconfig, args.context)


def make_context(args, need_server: bool, need_figures: bool, stored: dict[str, Any] | None = None):
    from rl_rollout import controller, sources

    stored = stored or {}
    server_url = args.server or stored.get("server")
    if args.config and need_server and not server_url:
        raise RolloutError("--config needs --server URL: the server that serves FILE confirms each change")
    target = make_target(args)
    server = sources.ServerClient(server_url) if server_url else None
    source = None
    if need_figures:
        prom = getattr(args, "prometheus", None) or (None if args.server else stored.get("prometheus"))
        if prom:
            sel = getattr(args, "prom_selector", None) or stored.get("prom_selector")
            source = sources.Prometheus(prom, args.name, sel)
        elif server is not None:
            source = sources.ServerStats(server, args.name)
        else:
            raise RolloutError("no figures source: give --server URL or --prometheus URL")
    elif getattr(args, "prom_selector", None) and not getattr(args, "prometheus", None):
        raise RolloutError("--prom-selector goes with --prometheus")
    return controller.Context(args.name, target, source, server)


def _source_info(args, ctx) -> dict[str, Any]:
    from rl_rollout.sources import Prometheus

    out: dict[str, Any] = {"server": ctx.server.url if ctx.server else None}
    if isinstance(ctx.source, Prometheus):
        out.update(prometheus=ctx.source.url, prom_selector=ctx.source.selector)
    return out


def _result(args, ctx, st, code: int) -> int:
    from rl_rollout import controller

    rec = ctx.target.read_record(st.policy) if not st.active else None
    line = controller.status_line(st.policy, rec if rec and rec.get("id") == st.id else st.to_json())
    if getattr(args, "json", False):
        print(json.dumps({"exit_code": code, **controller.record_of(st)}, sort_keys=True))
    else:
        print(line, flush=True)
    return code


def cmd_start(args) -> int:
    from rl_rollout import controller, judge, sources, state

    if args.prom_selector is not None:
        sources.check_selector(args.prom_selector)
    steps = state.parse_steps(args.steps)
    if args.min_episodes < 2:
        raise RolloutError("--min-episodes must be at least 2 (a variance needs two episodes)")
    if args.min_agreement is not None and args.mode != "shadow":
        raise RolloutError("--min-agreement applies to --mode shadow only")
    ctx = make_context(args, need_server=True, need_figures=True)
    cfg = ctx.target.read()
    spec = state.policy_spec(cfg, args.name)
    cur = state.read_rollout(cfg, args.name)
    if cur is not None and cur.active:
        if args.resume:
            return _resume(args, ctx, cur)
        raise RolloutError(controller.running_line(cur))
    info = controller.served_info(ctx) if ctx.server else {}
    local = args.config is not None
    candidate, cand_id, registry = controller.prepare_candidate(args.candidate, local)
    champ_id = info.get("checkpoint_id")
    if candidate == spec["checkpoint"] or (cand_id and champ_id and cand_id == champ_id):
        raise RolloutError(f"candidate {args.candidate} is the champion of {args.name} already "
                           f"(checkpoint_id {cand_id or champ_id})")
    try:
        ctx.source.fetch()
    except sources.FiguresUnavailable as e:
        raise RolloutError(f"figures unavailable at start: {e}") from None
    limits = judge.Limits(max_error_ratio=args.max_error_ratio, max_p99_ms=args.max_p99_ms,
                          min_episodes=args.min_episodes, min_requests=args.min_requests, max_hold=args.max_hold,
                          min_agreement=args.min_agreement)
    st = controller.new_state(ctx, candidate, cand_id, registry, spec["checkpoint"], champ_id, args.mode, steps,
                              limits, args.interval, args.drain_timeout, args.apply_timeout, _source_info(args, ctx))
    code = controller.begin(ctx, st)
    if code is not None:
        return _result(args, ctx, st, code)
    if args.detach:
        st.controller = None
        controller.persist(ctx, st, controlled=False)
        print(f"{args.name}: rollout {st.id} at {st.step_pct:g}% ({st.mode}); drive it with "
              f"`rl-rollout resume {args.name} {_target_text(args)}`", flush=True)
        return EXIT_OK
    return _result(args, ctx, st, _driven(ctx, st, controller.drive))


def _target_text(args) -> str:
    if args.config:
        return f"--config {args.config} --server {args.server}"
    return f"--rayservice {args.rayservice}" + (f" -n {args.namespace}" if args.namespace else "") + \
        (f" --server {args.server}" if args.server else "")


def _driven(ctx, st, fn) -> int:
    """Run the loop; on Ctrl-C leave the rollout where it is, without a controller."""
    from rl_rollout import controller

    try:
        return fn(ctx, st)
    except KeyboardInterrupt:
        try:
            controller.persist(ctx, st, controlled=False)
        except (controller.Aborted, RolloutError, KeyboardInterrupt):
            pass
        print(f"\nrl-rollout: stopped; rollout {st.id} stays at {st.step_pct:g}% in the config; "
              f"`rl-rollout resume {st.policy}` continues, `rl-rollout abort {st.policy}` removes the candidate",
              file=sys.stderr)
        return EXIT_INTERRUPTED


def _resume(args, ctx, st) -> int:
    from rl_rollout import controller

    return _result(args, ctx, st, _driven(ctx, st, controller.resume))


def cmd_resume(args) -> int:
    from rl_rollout import state

    ctx = make_context(args, need_server=False, need_figures=False)
    cfg = ctx.target.read()
    state.policy_spec(cfg, args.name)
    st = state.read_rollout(cfg, args.name)
    if st is None or not st.active:
        raise RolloutError(f"no rollout of {args.name} to resume" + (f" (the last one is {st.status})" if st else ""))
    ctx = make_context(args, need_server=True, need_figures=True, stored=st.source)
    if ctx.server:
        from rl_rollout import controller
        controller.served_info(ctx)
    return _resume(args, ctx, st)


def cmd_status(args) -> int:
    from rl_rollout import controller, state

    target = make_target(args)
    cfg = target.read()
    spec = state.policy_spec(cfg, args.name)
    st = state.read_rollout(cfg, args.name)
    rec = st.to_json() if st is not None else target.read_record(args.name)
    if args.json:
        if rec is not None:
            rec.pop("baseline", None) if st is None else None
        print(json.dumps({"policy": args.name, "champion": spec["checkpoint"],
                          "candidate": state.candidate_block(cfg, args.name) and
                          {k: v for k, v in state.candidate_block(cfg, args.name).items() if k != "rollout"},
                          "rollout": rec}, sort_keys=True))
    else:
        print(controller.status_line(args.name, rec, spec["checkpoint"]))
    return EXIT_OK


def cmd_abort(args) -> int:
    import getpass
    import socket

    from rl_rollout import controller

    ctx = make_context(args, need_server=False, need_figures=False)
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    st = controller.abort(ctx, f"aborted by {who}" + (f": {args.reason}" if args.reason else ""))
    print(controller.status_line(args.name, controller.record_of(st)))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        return {"start": cmd_start, "resume": cmd_resume, "status": cmd_status, "abort": cmd_abort}[args.command](args)
    except RolloutError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
