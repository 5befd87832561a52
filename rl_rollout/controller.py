"""The rollout loop: write the desired state, confirm the server applied it, judge each interval, act.

    start   checks (policy served, candidate resolvable, no rollout running, figures readable), writes the
            candidate at the first step's weight with the rollout state, confirms, takes the baselines
    drive   every interval: figures -> windows -> judge -> hold | pause | advance (next weight, confirm, new step
            baseline) | rollback | promote (drain sticky champion sessions, champion := candidate, registry
            champion moved) | complete (shadow)
    abort   candidate removed, status aborted (a controller driving the rollout notices and stops)

Every change goes through target.update and first checks the rollout in the config is still this one (same id,
still active): `rl-rollout abort` from another shell wins over a running controller.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rl_rollout import judge as J
from rl_rollout.errors import (EXIT_ABORTED, EXIT_OK, EXIT_PAUSED, EXIT_ROLLED_BACK,
                               FiguresUnavailable, RolloutError)
from rl_rollout.figures import CountersReset, Snapshot, window
from rl_rollout.sources import ServerClient
from rl_rollout.state import (ABORTED, ACTIVE, COMPLETED, PAUSED, PROMOTED, ROLLED_BACK, RUNNING, RolloutState,
                              candidate_block, policy_spec, promoted, read_rollout, with_rollout, without_candidate)

POLL_S = 0.5  # confirmation polls
CATCH_UP_S = 30.0  # how long a step's baseline waits for the figures to show the versions just applied
ABORT_CHECK_S = 5.0  # how often a waiting controller re-reads the config (abort from another shell)


class Aborted(Exception):
    """The rollout in the config is no longer this controller's (aborted, or replaced)."""


class CandidateLoadError(Exception):
    """The server reports that the candidate failed to load."""


class NotApplied(Exception):
    """The server (or KubeRay) did not apply the written config in time."""


_T0 = time.monotonic()


def _say(msg: str) -> None:
    print(f"rl-rollout [{time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


@dataclass
class Context:
    name: str
    target: Any  # targets.LocalFile | targets.RayService
    source: Any  # sources.ServerStats | sources.Prometheus
    server: ServerClient | None
    say: Callable[[str], None] = field(default=_say)


def me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "heartbeat": round(time.time(), 3)}


def _fmt_age(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


# ---------------------------------------------------------------------------------------------- the candidate
def prepare_candidate(location: str, local: bool) -> tuple[str, str | None, dict[str, Any] | None]:
    """-> (the checkpoint to write, its checkpoint_id when known here, registry info for a registry version).

    Local target: a path must exist (written absolute: the server may run elsewhere) and resolve as a checkpoint;
    a URI or registry reference must resolve. RayService target: paths are the Serve pods' own, so only registry
    references whose root is reachable here are resolved; the rest is for the server to load (a load error rolls
    back)."""
    from rl_checkpoint import CheckpointError, is_uri, resolve
    from rl_checkpoint.registry import REGISTRY_ENV, is_registry_ref, parse_ref, resolve_ref

    if not location or not location.strip():
        raise RolloutError("CANDIDATE is empty: give a checkpoint path, URI or registry:<root>/<name>@<version|alias>")
    if is_registry_ref(location):
        try:
            root, name, ref = parse_ref(location)
        except CheckpointError as e:
            raise RolloutError(f"candidate {location!r}: {e}") from None
        info: dict[str, Any] = {"root": root or os.environ.get(REGISTRY_ENV), "name": name, "ref": ref,
                                "version": None}
        try:
            version, ckpt = resolve_ref(location)
        except CheckpointError as e:
            if local:
                raise RolloutError(f"candidate {location!r}: {e}") from None
            return location, None, info
        info["version"] = version.version
        return location, ckpt.checkpoint_id, info
    if not local:
        return location, None, None
    if not is_uri(location):
        p = Path(location).expanduser()
        location = str(p if p.is_absolute() else (Path.cwd() / p).resolve())
        if not Path(location).is_dir():
            raise RolloutError(f"candidate checkpoint directory {location!r} does not exist")
    try:
        return location, resolve(location).checkpoint_id, None
    except CheckpointError as e:
        raise RolloutError(f"candidate {location!r}: {e}") from None


def served_info(ctx: Context) -> dict[str, Any]:
    """GET /v1/policies/NAME at start: bad input (exit 2) when the server is unreachable or lacks NAME."""
    assert ctx.server is not None
    try:
        return ctx.server.info(ctx.name)
    except LookupError:
        raise RolloutError(f"the server at {ctx.server.url} does not serve policy {ctx.name!r}") from None
    except FiguresUnavailable as e:
        raise RolloutError(str(e)) from None


def _load_error(info: dict[str, Any], candidate: str | None = None) -> str | None:
    """The server's load error for `candidate` (any candidate when None). An error about another checkpoint is
    stale (a candidate of an earlier config, until the server applies the new one) and is not ours."""
    err = info.get("candidate_error")
    if not err:
        return None
    if candidate is not None and isinstance(err, dict) and err.get("checkpoint"):
        from rl_checkpoint import redact

        if err["checkpoint"] not in (candidate, redact(candidate)):
            return None
    if isinstance(err, dict):
        err = err.get("message") or err.get("error") or err
    return " ".join(str(err).split())


# ---------------------------------------------------------------------------------------------- persistence
def _ours(cfg: dict[str, Any], st: RolloutState) -> RolloutState:
    cur = read_rollout(cfg, st.policy)
    if cur is None or cur.id != st.id or cur.status not in ACTIVE:
        raise Aborted(cur.reason if cur is not None and cur.id == st.id else "")
    return cur


def persist(ctx: Context, st: RolloutState, controlled: bool = True) -> None:
    """Write the rollout (and the candidate's weight) into the config, if it is still ours."""
    st.updated_at = round(time.time(), 3)
    st.controller = me() if controlled else None

    def fn(cfg):
        _ours(cfg, st)
        return with_rollout(cfg, st)

    ctx.target.update(fn)


def check_still_ours(ctx: Context, st: RolloutState) -> None:
    _ours(ctx.target.read(), st)


def aborted_reason(ctx: Context, st: RolloutState, hint: str = "") -> str:
    rec = ctx.target.read_record(st.policy) or {}
    if rec.get("id") == st.id and rec.get("reason"):
        return rec["reason"]
    return hint or "the rollout was removed from the config"


def record_of(st: RolloutState) -> dict[str, Any]:
    rec = st.to_json()
    rec.pop("baseline", None)
    return rec


# ---------------------------------------------------------------------------------------------- confirmation
def wait_applied(ctx: Context, st: RolloutState, expect: str, marker: Any = None) -> None:
    """Poll until the target reports the change applied and the server serves what `expect` says:
    "candidate" (the candidate at the current weight and mode), "champion" (no candidate), "promoted" (the
    candidate's checkpoint as champion, no candidate). CandidateLoadError / NotApplied otherwise."""
    deadline = time.monotonic() + st.apply_timeout_s
    why = "not checked yet"
    while True:
        done, why = ctx.target.applied(marker)
        if done and ctx.server is not None:
            try:
                info = ctx.server.info(st.policy)
            except (FiguresUnavailable, LookupError) as e:
                done, why, info = False, str(e), {}
            cand = info.get("candidate") if info else None
            if expect == "candidate" and info:
                err = _load_error(info, st.candidate)
                if err and not (cand and cand.get("checkpoint_id") == st.candidate_checkpoint_id):
                    raise CandidateLoadError(err)
                if not cand:
                    done, why = False, "the server serves no candidate yet"
                else:
                    w, m, cid = cand.get("weight"), cand.get("mode", "split"), cand.get("checkpoint_id")
                    if st.candidate_checkpoint_id and cid != st.candidate_checkpoint_id:
                        done, why = False, f"the server's candidate is {cid}, not {st.candidate_checkpoint_id}"
                    elif w is None or abs(float(w) - st.weight) > 1e-6 or m != st.mode:
                        done, why = False, f"the server's candidate runs at weight {w} ({m}), not {st.weight} ({st.mode})"
                    elif not st.candidate_checkpoint_id:
                        st.candidate_checkpoint_id = cid  # known now (a RayService's pod-side path)
            elif expect in ("champion", "promoted") and info:
                if cand:
                    done, why = False, f"the server still serves candidate {cand.get('checkpoint_id')}"
                elif expect == "promoted" and st.candidate_checkpoint_id and \
                        info.get("checkpoint_id") != st.candidate_checkpoint_id:
                    done, why = False, (f"the server's champion is {info.get('checkpoint_id')}, not "
                                        f"{st.candidate_checkpoint_id}")
        if done:
            return
        if time.monotonic() > deadline:
            raise NotApplied(f"{ctx.target.kind} was not applied within {st.apply_timeout_s:g}s "
                             f"(--apply-timeout): {why}")
        time.sleep(POLL_S)


# ---------------------------------------------------------------------------------------------- start
def new_state(ctx: Context, candidate: str, candidate_id: str | None, registry: dict[str, Any] | None,
              champion: str, champion_id: str | None, mode: str, steps: list[float], limits: J.Limits,
              interval_s: float, drain_timeout_s: float, apply_timeout_s: float, source: dict[str, Any]) -> RolloutState:
    now = round(time.time(), 3)
    return RolloutState(
        id=f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}", policy=ctx.name, candidate=candidate,
        champion=champion, mode=mode, steps=list(steps), interval_s=interval_s, min_episodes=limits.min_episodes,
        min_requests=limits.min_requests, max_error_ratio=limits.max_error_ratio, max_p99_ms=limits.max_p99_ms,
        max_hold=limits.max_hold, min_agreement=limits.min_agreement, drain_timeout_s=drain_timeout_s,
        apply_timeout_s=apply_timeout_s, candidate_checkpoint_id=candidate_id, champion_checkpoint_id=champion_id,
        registry=registry, source=source, started_at=now, step_started_at=now)


def running_line(st: RolloutState) -> str:
    return (f"a rollout of {st.policy} is already {st.status}: {st.id}, candidate {st.candidate} at "
            f"{st.step_pct:g}% (rl-rollout status/resume/abort {st.policy})")


def begin(ctx: Context, st: RolloutState) -> int | None:
    """Write the first step, confirm it, take the baselines. -> an exit code when the rollout ended here."""
    def fn(cfg):
        cur = read_rollout(cfg, st.policy)
        if cur is not None and cur.active:
            raise RolloutError(running_line(cur))
        if candidate_block(cfg, st.policy) is not None:
            raise RolloutError(f"policy {st.policy!r} already has a candidate "
                               f"({candidate_block(cfg, st.policy).get('checkpoint')}) that no rollout manages; "
                               "remove it from the config first")
        return with_rollout(cfg, st)

    st.event("start", f"candidate {st.candidate} ({st.mode}), steps {'/'.join(f'{s:g}' for s in st.steps)}%")
    st.controller = me()
    marker = ctx.target.marker()
    ctx.target.update(fn)
    ctx.say(f"{st.policy}: rollout {st.id} started: candidate {st.candidate} at {st.step_pct:g}% ({st.mode}) "
            f"in {ctx.target.kind}")
    code = apply_and_baseline(ctx, st, marker)
    return code


def apply_and_baseline(ctx: Context, st: RolloutState, marker: Any, first: bool = True) -> int | None:
    """Confirm the current step is served, then start the step's window (and the rollout's, at the first)."""
    try:
        wait_applied(ctx, st, "candidate", marker)
    except CandidateLoadError as e:
        return finish(ctx, st, ROLLED_BACK, f"candidate failed to load: {e}", EXIT_ROLLED_BACK)
    except NotApplied as e:
        return stop_paused(ctx, st, str(e))
    snap = _caught_up(ctx, st)
    now = round(time.time(), 3)
    st.step_started_at = now
    st.baseline["step"] = snap.to_json() if snap else None
    if first and st.step == 0:
        st.started_at = now
        st.baseline["rollout"] = snap.to_json() if snap else None
    persist(ctx, st)
    return None


def lagging(st: RolloutState, snap: Snapshot) -> str | None:
    """Why `snap` does not yet show this rollout's versions, or None. Both sources name the checkpoint each version
    serves; one that names another, or none for a version the rollout applied, is behind the server: Prometheus
    sees a change a report and a scrape interval after the server made it (CI took a baseline 1.5 s after the
    start, when Prometheus still showed the previous candidate gone and not yet this one)."""
    for role, want in (("candidate", st.candidate_checkpoint_id), ("champion", st.champion_checkpoint_id)):
        fig = getattr(snap, role)
        have = fig.checkpoint_id if fig is not None else None
        if want and not have:
            return f"the figures from {snap.source} do not show {role} {want} yet"
        if want and have != want:
            return f"the figures from {snap.source} still show {role} {have}, not {want}"
    return None


def _caught_up(ctx: Context, st: RolloutState) -> Snapshot | None:
    """A snapshot showing the versions just applied, polled for up to CATCH_UP_S; None (the baseline is then taken
    at the next interval that shows them) when unavailable or still behind."""
    deadline = time.monotonic() + min(CATCH_UP_S, st.apply_timeout_s)
    while True:
        try:
            snap = ctx.source.fetch()
        except FiguresUnavailable as e:
            ctx.say(f"{st.policy}: no baseline yet ({e}); taken at the next interval")
            return None
        why = lagging(st, snap)
        if why is None:
            return snap
        if time.monotonic() > deadline:
            ctx.say(f"{st.policy}: no baseline yet ({why}); taken at the next interval")
            return None
        time.sleep(POLL_S)


# ---------------------------------------------------------------------------------------------- ending
def finish(ctx: Context, st: RolloutState, status: str, reason: str, code: int,
           change: Callable[[dict[str, Any]], dict[str, Any]] | None = None, expect: str = "champion",
           outcome: dict[str, Any] | None = None) -> int:
    """End the rollout: write the config without the candidate (or `change`), keep the record, confirm."""
    st.status, st.reason, st.controller = status, reason, None
    st.outcome = {**(st.outcome or {}), **(outcome or {})}
    st.event(status, reason)
    marker = ctx.target.marker()

    def fn(cfg):
        _ours(cfg, st)
        return (change or (lambda c: without_candidate(c, st.policy)))(cfg)

    ctx.target.update(fn)
    ctx.target.write_record(st.policy, record_of(st))
    try:
        wait_applied(ctx, st, expect, marker)
    except NotApplied as e:
        st.outcome["unconfirmed"] = str(e)
        ctx.target.write_record(st.policy, record_of(st))
        ctx.say(f"{st.policy}: warning: {e}")
    return code


def stop_paused(ctx: Context, st: RolloutState, reason: str) -> int:
    if st.status != PAUSED or st.reason != reason:
        st.event("pause", reason)
    st.status, st.reason = PAUSED, reason
    persist(ctx, st, controlled=False)
    ctx.say(f"{st.policy}: paused: {reason}; `rl-rollout resume {st.policy}` continues, `rl-rollout abort "
            f"{st.policy}` removes the candidate")
    return EXIT_PAUSED


def drain(ctx: Context, st: RolloutState) -> dict[str, Any]:
    """At 100% new sessions all go to the candidate: wait (bounded) until the champion's sticky sessions end, so
    no session sees two versions. -> what happened, for the record."""
    return _wait_sessions(ctx, st, "champion", "promoting: they continue on the new champion")


def rollback(ctx: Context, st: RolloutState, reason: str) -> int:
    """Roll back without moving a session between versions: weight 0 (new sessions go to the champion) until
    the candidate's sticky sessions end (bounded by --drain-timeout), then remove the candidate. Shadow mode
    has no sessions on the candidate: removed at once."""
    outcome: dict[str, Any] = {}
    if st.mode == "split":
        if not st.draining:
            st.draining, st.reason = True, reason
            st.event("drain", f"rolling back: {reason}; the candidate takes no new sessions")
            ctx.say(f"{st.policy}: rolling back ({reason}); draining the candidate's sessions")
            marker = ctx.target.marker()
            persist(ctx, st)
            try:
                wait_applied(ctx, st, "candidate", marker)
            except (NotApplied, CandidateLoadError) as e:
                outcome["drain"] = f"weight 0 not confirmed ({e}); removing the candidate now"
        if "drain" not in outcome:
            outcome = _wait_sessions(ctx, st, "candidate",
                                     "rolling back: they continue on the champion")
    return finish(ctx, st, ROLLED_BACK, reason, EXIT_ROLLED_BACK, outcome=outcome)


def _wait_sessions(ctx: Context, st: RolloutState, side: str, on_timeout: str) -> dict[str, Any]:
    """Wait (bounded by --drain-timeout) until `side`'s sticky sessions have ended. -> what happened."""
    deadline = time.monotonic() + st.drain_timeout_s
    while True:
        try:
            snap = ctx.source.fetch()
            figs = getattr(snap, side)
            open_ = figs.active_sessions if figs is not None else 0
        except FiguresUnavailable as e:
            open_ = f"unknown ({e})"
        if open_ is None:
            return {"drain": "not waited: the figures source reports no open sessions"}
        if open_ == 0:
            return {"drain": f"{side} sessions drained"}
        if time.monotonic() > deadline:
            ctx.say(f"{st.policy}: {open_} {side} sessions still open after {st.drain_timeout_s:g}s "
                    f"(--drain-timeout); {on_timeout}")
            return {"drain": f"{open_} {side} sessions still open after {st.drain_timeout_s:g}s"}
        time.sleep(min(1.0, max(st.interval_s / 4, 0.2)))


def move_registry(st: RolloutState, reason: str) -> dict[str, Any]:
    """Registry.promote of the candidate's version; forced with the rollout's reason when the offline gate
    refuses (the live verdict is the evidence). -> the outcome, for the record."""
    from rl_checkpoint.errors import CheckpointError
    from rl_checkpoint.registry import PromotionRefused, Registry

    reg = st.registry or {}
    try:
        registry = Registry.open(reg.get("root"))
        version = reg.get("version") or registry.get(reg["name"], reg.get("ref") or "champion").version
        try:
            res = registry.promote(reg["name"], version)
        except PromotionRefused as e:
            if not e.decision.forceable:
                return {"registry": {"moved": False, "error": str(e)}}
            res = registry.promote(reg["name"], version, force_reason=f"rl-rollout {st.id}: {reason}")
        return {"registry": {"moved": True, "name": res.name, "champion": res.version, "previous": res.previous,
                             "forced": res.forced, "gate": res.decision.message, "force_reason": res.force_reason}}
    except CheckpointError as e:  # RegistryError included: unreachable, unknown, already the champion
        return {"registry": {"moved": False, "error": " ".join(str(e).split())}}


def promote(ctx: Context, st: RolloutState, reason: str) -> int:
    outcome = drain(ctx, st) if st.mode == "split" else {}
    code = finish(ctx, st, PROMOTED, reason, EXIT_OK, change=lambda c: promoted(c, st.policy, st.candidate),
                  expect="promoted", outcome=outcome)
    if st.registry:
        st.outcome.update(move_registry(st, reason))
        ctx.target.write_record(st.policy, record_of(st))
        r = st.outcome["registry"]
        if r.get("moved"):
            how = f" FORCED over the gate ({r['gate']})" if r.get("forced") else ""
            ctx.say(f"{st.policy}: registry {r['name']} champion -> v{r['champion']}{how}")
        else:
            ctx.say(f"{st.policy}: warning: the registry's champion was not moved: {r.get('error')}")
    return code


# ---------------------------------------------------------------------------------------------- the loop
def _sleep_until(ctx: Context, st: RolloutState, when: float) -> None:
    """Sleep to `when` (monotonic), re-reading the config now and then: an abort stops the wait."""
    while True:
        left = when - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, ABORT_CHECK_S))
        if left > ABORT_CHECK_S:
            check_still_ours(ctx, st)


def drive(ctx: Context, st: RolloutState) -> int:
    """Judge every interval until the rollout ends. -> exit code."""
    try:
        return _drive(ctx, st)
    except Aborted as e:
        ctx.say(f"{st.policy}: rollout {st.id} aborted: {aborted_reason(ctx, st, str(e))}")
        return EXIT_ABORTED


def _drive(ctx: Context, st: RolloutState) -> int:
    limits = st.limits()
    next_at = time.monotonic() + st.interval_s
    while True:
        _sleep_until(ctx, st, next_at)
        next_at = max(next_at + st.interval_s, time.monotonic() + st.interval_s / 2)
        check_still_ours(ctx, st)
        snap, unavailable = None, None
        try:
            snap = ctx.source.fetch()
        except FiguresUnavailable as e:
            unavailable = str(e)
        lag = lagging(st, snap) if snap is not None else None
        # No candidate in the figures, or not this one yet: the server says whether it failed to load.
        if snap is not None and (snap.candidate is None or lag) and ctx.server is not None:
            try:
                err = _load_error(ctx.server.info(st.policy), st.candidate)
            except (FiguresUnavailable, LookupError) as e:
                err, unavailable = None, str(e)
            if err:
                return finish(ctx, st, ROLLED_BACK, f"candidate failed to load: {err}", EXIT_ROLLED_BACK)
            if snap.candidate is None:
                unavailable = unavailable or "the server reports no candidate for this policy"
        if snap is not None and unavailable is None:
            unavailable = lag
        step_w = roll_w = None
        if snap is not None and unavailable is None:
            if not st.baseline.get("rollout") or not st.baseline.get("step"):
                st.baseline.setdefault("rollout", None)
                st.baseline["rollout"] = st.baseline["rollout"] or snap.to_json()
                st.baseline["step"] = st.baseline.get("step") or snap.to_json()
                unavailable = "baseline taken now (the figures were unavailable when the step started)"
            else:
                try:
                    step_w = window(snap, Snapshot.from_json(st.baseline["step"]))
                    roll_w = window(snap, Snapshot.from_json(st.baseline["rollout"]))
                except CountersReset as e:
                    st.baseline["rollout"] = st.baseline["step"] = snap.to_json()
                    unavailable = f"counters went backwards ({e}; a replica restarted?): judging again from now"
        d = J.judge(step_w, roll_w, limits, mode=st.mode, step_pct=st.step_pct, next_pct=st.next_pct,
                    holds=st.holds, unavailable=unavailable)
        st.last = {"at": round(time.time(), 3), "action": d.action, "rule": d.rule, "reason": d.reason,
                   "figures": d.figures}
        ctx.say(f"{st.policy} {st.step_pct:g}%: {d.action}: {d.reason}")
        if d.action == J.PAUSE and d.retry:
            if st.status != PAUSED:
                st.event("pause", d.reason)
            st.status, st.reason = PAUSED, d.reason
            persist(ctx, st)
            continue
        if st.status == PAUSED and d.action != J.PAUSE:
            st.event("resume", "figures available again")
        st.status, st.reason = RUNNING, d.reason
        if d.action == J.PAUSE:
            return stop_paused(ctx, st, d.reason)
        if d.action == J.HOLD:
            st.holds += 1
            persist(ctx, st)
        elif d.action == J.ROLLBACK:
            return rollback(ctx, st, d.reason)
        elif d.action == J.COMPLETE:
            return finish(ctx, st, COMPLETED, d.reason + " (shadow never promotes: start a split rollout next)",
                          EXIT_OK)
        elif d.action == J.PROMOTE:
            return promote(ctx, st, d.reason)
        elif d.action == J.ADVANCE:
            st.step += 1
            st.holds = 0
            st.event("advance", d.reason)
            marker = ctx.target.marker()
            persist(ctx, st)
            code = apply_and_baseline(ctx, st, marker, first=False)
            if code is not None:
                return code
            next_at = time.monotonic() + st.interval_s


def resume(ctx: Context, st: RolloutState) -> int:
    """Continue a rollout from the state in the config (after a restart, a pause, or --detach)."""
    hb = st.controller or {}
    age = time.time() - float(hb.get("heartbeat") or 0)
    if hb and age < 2 * st.interval_s + 30 and (hb.get("host"), hb.get("pid")) != (me()["host"], os.getpid()):
        alive = hb.get("host") != me()["host"] or _pid_alive(int(hb.get("pid") or 0))
        if alive:
            raise RolloutError(f"rollout {st.id} of {st.policy} is driven by controller pid {hb.get('pid')} on "
                               f"{hb.get('host')} (heartbeat {_fmt_age(age)} ago); stop it first or "
                               f"`rl-rollout abort {st.policy}`")
    if st.draining:  # stopped while rolling back: finish the rollback
        ctx.say(f"{st.policy}: resuming rollout {st.id}: it was rolling back ({st.reason})")
        try:
            return rollback(ctx, st, st.reason)
        except Aborted as e:
            ctx.say(f"{st.policy}: rollout {st.id} aborted: {aborted_reason(ctx, st, str(e))}")
            return EXIT_ABORTED
    was = st.status
    st.status, st.holds = RUNNING, 0
    st.event("resume", f"resumed from {was} at {st.step_pct:g}%")
    ctx.say(f"{st.policy}: resuming rollout {st.id} at {st.step_pct:g}% ({st.mode}), was {was}")
    marker = ctx.target.marker()
    try:
        persist(ctx, st)
        wait_applied(ctx, st, "candidate", marker)
    except Aborted as e:
        ctx.say(f"{st.policy}: rollout {st.id} aborted: {aborted_reason(ctx, st, str(e))}")
        return EXIT_ABORTED
    except CandidateLoadError as e:
        return finish(ctx, st, ROLLED_BACK, f"candidate failed to load: {e}", EXIT_ROLLED_BACK)
    except NotApplied as e:
        return stop_paused(ctx, st, str(e))
    return drive(ctx, st)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def abort(ctx: Context, reason: str) -> RolloutState:
    """Remove the candidate of the active rollout and record it aborted."""
    holder: dict[str, RolloutState] = {}

    def fn(cfg):
        st = read_rollout(cfg, ctx.name)
        if st is None or not st.active:
            what = f"its last rollout is {st.status}" if st else "none is running"
            raise RolloutError(f"no rollout of {ctx.name} to abort ({what})")
        st.status, st.reason, st.controller = ABORTED, reason, None
        st.event(ABORTED, reason)
        holder["st"] = st
        return without_candidate(cfg, ctx.name)

    policy_spec(ctx.target.read(), ctx.name)  # an unknown policy is bad input before anything else
    marker = ctx.target.marker()
    ctx.target.update(fn)
    st = holder["st"]
    ctx.target.write_record(ctx.name, record_of(st))
    if ctx.server is not None:
        try:
            wait_applied(ctx, st, "champion", marker)
        except NotApplied as e:
            ctx.say(f"{ctx.name}: warning: {e}")
    return st


# ---------------------------------------------------------------------------------------------- status
def status_line(name: str, st: RolloutState | dict[str, Any] | None, champion: str | None = None) -> str:
    if st is None:
        return f"{name}: no rollout" + (f" (champion {champion})" if champion else "")
    if isinstance(st, dict):
        st = RolloutState.from_json(st, "rollout record")
    now = time.time()
    head = (f"{name}: {st.status} at {st.step_pct:g}% (step {st.step + 1}/{len(st.steps)}, weight {st.weight:g}, "
            f"{st.mode}), candidate {st.candidate}")
    if st.status in ACTIVE:
        hb = st.controller or {}
        if hb.get("heartbeat"):
            head += f"; controller pid {hb.get('pid')} on {hb.get('host')} ({_fmt_age(now - hb['heartbeat'])} ago)"
        else:
            head += f"; no controller (`rl-rollout resume {name}` continues)"
        last = st.last or {}
        if last:
            head += f"; last decision {_fmt_age(now - last.get('at', now))} ago: {last.get('action')}: {last.get('reason')}"
        elif st.reason:
            head += f"; {st.reason}"
    else:
        when = st.history[-1]["at"] if st.history else st.updated_at
        head = (f"{name}: {st.status} {_fmt_age(now - when)} ago at {st.step_pct:g}% ({st.mode}), candidate "
                f"{st.candidate}: {st.reason}")
        reg = (st.outcome or {}).get("registry")
        if reg:
            head += (f"; registry champion v{reg['champion']}" + (" (forced)" if reg.get("forced") else "")
                     if reg.get("moved") else f"; registry not moved: {reg.get('error')}")
    return head
