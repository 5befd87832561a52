"""Versions under one policy name: a champion and an optional candidate (canary or shadow), sticky sessions,
episode feedback and per-version figures.

Everything here is per replica and knows nothing of HTTP routing: `serving/app.py` parses the request and calls
`PolicyVersions.act / act_batch / feedback / stats / end_session`; `reconfigure` loads checkpoints with
`load_versions` and installs them with `PolicyVersions.apply`.

- Assignment (split mode): a session's first request picks its version from a hash of the session id against
  the candidate's weight (reproducible, and raising the weight only moves *new* sessions); the choice is kept in
  a bounded table (max_sessions, least recently used first; session_ttl_s idle) until the session ends (feedback
  done=true, DELETE, expiry). Requests without a session id are split at random per request.
- Shadow mode: the champion answers everything; a share (`weight`) of the requests (per session, by the same
  hash) is queued to a worker thread that runs the candidate on the same input and counts agreement. The queue
  is bounded: when it is full the item is dropped and counted, never waited for.
- A candidate that raises while acting: the champion answers, the failure is counted as a candidate error and
  the session is pinned to the champion (its frame stack moves with it).
- Feedback: rewards accumulate per session; done=true ends the episode and adds its return to the figures of
  the version the session is assigned to.
- Transition log (user_config.log, serving/transitions.py): sampled sessions' steps, rewards and episode ends
  are handed to the replica's TransitionLog; a session that goes away mid-episode has its last step truncated.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import math
import queue
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from serving.config import SESSION_ID_MAX_LEN, CandidateSpec, ServingLimits
from serving.errors import ApiError, CheckpointError, bad_request, unprocessable
from serving.metrics import LATENCY_BOUNDARIES_MS, ServerMetrics
from serving.policy import LoadedPolicy, resolve_source
from serving.transitions import Episode, TransitionLog

logger = logging.getLogger("ray.serve")

CHAMPION, CANDIDATE = "champion", "candidate"
ACT_FIELDS = ("observation", "frame", "session_id", "reset")
FEEDBACK_FIELDS = ("session_id", "reward", "done", "truncated", "observation")
SHADOW_QUEUE = 1024  # items waiting for the shadow worker; more are dropped (and counted)
SHADOW_BATCH = 16  # observations per shadow forward: small, so the worker holds the GIL in short slices
# After the first mirrored item the worker waits this long for more before one forward: at a few hundred
# requests/s a forward per item would take the GIL from the request path as often as requests arrive.
SHADOW_LINGER_S = 0.005
ENDED_PER_SESSION = 4  # ended sessions remembered (for 409 vs 404): this many times max_sessions


def hash01(session_id: str) -> float:
    """A session id -> [0, 1), the same in every replica and process (assignment must be reproducible)."""
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big") / 2.0 ** 64


# ------------------------------------------------------------------------------------------------ figures


class VersionStats:
    """One version's figures in this replica since it loaded (GET /v1/policies/NAME/stats)."""

    __slots__ = ("requests", "errors", "buckets", "lat_sum", "lat_count", "episodes", "return_sum",
                 "return_sq_sum", "compared", "agreed", "dropped", "shadow_errors")

    def __init__(self) -> None:
        self.requests = self.errors = self.lat_count = self.episodes = 0
        self.compared = self.agreed = self.dropped = self.shadow_errors = 0
        self.buckets = [0] * (len(LATENCY_BOUNDARIES_MS) + 1)
        self.lat_sum = self.return_sum = self.return_sq_sum = 0.0

    def answered(self, latency_ms: float) -> None:
        self.requests += 1
        self.buckets[bisect.bisect_left(LATENCY_BOUNDARIES_MS, latency_ms)] += 1  # le semantics: v <= bound
        self.lat_sum += latency_ms
        self.lat_count += 1

    def failed(self) -> None:
        self.requests += 1
        self.errors += 1

    def latency(self) -> dict[str, Any]:
        counts, total = [], 0
        for c in self.buckets:
            total += c
            counts.append(total)
        return {"le": [*LATENCY_BOUNDARIES_MS, "+Inf"], "counts": counts, "sum": self.lat_sum, "count": self.lat_count}


class Version:
    """A loaded checkpoint in a role (champion / candidate), with its figures."""

    __slots__ = ("pol", "stats", "failures")

    def __init__(self, pol: LoadedPolicy):
        self.pol = pol
        self.stats = VersionStats()
        self.failures = 0


# ------------------------------------------------------------------------------------------------ sessions


class Session:
    __slots__ = ("role", "ret", "seen", "mirror", "frames", "log")

    def __init__(self, role: str, mirror: bool, now: float):
        self.role = role
        self.ret = 0.0
        self.seen = now
        self.mirror = mirror  # shadow mode: this session's requests are mirrored to the candidate
        self.frames = False  # its last act sent a 'frame' (a final feedback observation is one too)
        self.log: Episode | None = None  # transition log: the episode being logged (None: session not sampled)


class Assignments:
    """Sticky version per session, bounded by count (least recently used first) and idle time; plus a bounded
    record of sessions that ended, so feedback can tell "already ended" (409) from "never acted" (404)."""

    def __init__(self, max_sessions: int, ttl_s: float):
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._open: OrderedDict[str, Session] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()
        self.counts = {CHAMPION: 0, CANDIDATE: 0}
        self.changed = False  # counts changed since the gauges were last set
        self.on_drop: Callable[[str, Session], None] | None = None  # a session leaves the table (any reason)

    def __len__(self) -> int:
        return len(self._open)

    def configure(self, limits: ServingLimits) -> None:
        self.max_sessions, self.ttl_s = limits.max_sessions, limits.session_ttl_s

    def open(self, sid: str, choose: Callable[[str], tuple[str, bool]]) -> tuple[Session, bool]:
        """-> (the session, whether it started now); a new one gets its version from `choose(sid)`."""
        now = time.monotonic()
        self.expire(now)
        s = self._open.pop(sid, None)
        new = s is None
        if new:
            role, mirror = choose(sid)
            s = Session(role, mirror, now)
            self.counts[role] += 1
            self.changed = True
            self._ended.pop(sid, None)
        s.seen = now
        self._open[sid] = s
        while len(self._open) > self.max_sessions:
            self._drop(*self._open.popitem(last=False))
        return s, new

    def get(self, sid: str) -> Session | None:
        self.expire(time.monotonic())
        return self._open.get(sid)

    def touch(self, sid: str, s: Session) -> None:
        s.seen = time.monotonic()
        self._open.move_to_end(sid)

    def was_ended(self, sid: str) -> bool:
        return sid in self._ended

    def end(self, sid: str) -> Session | None:
        s = self._open.pop(sid, None)
        if s is not None:
            self._drop(sid, s)
            self._ended[sid] = None
            self._ended.move_to_end(sid)
            while len(self._ended) > ENDED_PER_SESSION * self.max_sessions:
                self._ended.popitem(last=False)
        return s

    def set_role(self, s: Session, role: str) -> None:
        if s.role != role:
            self.counts[s.role] -= 1
            self.counts[role] += 1
            s.role = role
            self.changed = True

    def with_role(self, role: str) -> list[tuple[str, Session]]:
        return [(sid, s) for sid, s in self._open.items() if s.role == role]

    def items(self) -> list[tuple[str, Session]]:
        return list(self._open.items())

    def expire(self, now: float) -> None:
        od = self._open
        while od:
            sid, s = next(iter(od.items()))
            if now - s.seen <= self.ttl_s:
                break
            od.popitem(last=False)
            self._drop(sid, s)

    def _drop(self, sid: str, s: Session) -> None:
        self.counts[s.role] -= 1
        self.changed = True
        if self.on_drop is not None:
            self.on_drop(sid, s)


# ------------------------------------------------------------------------------------------------ batching


class Failed:
    """A forward pass that raised, as the result of each item it held (one version's failure is its own)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


class Batcher:
    """Per-policy dynamic batching with `serve.batch`: concurrent single-observation requests share one forward.

    Items carry the policy object they act with (champion, candidate, or a policy a reload just replaced), so a
    batch runs each observation on its own module; a module that raises fails only its own items (`Failed`).
    """

    def __init__(self, name: str, metrics: ServerMetrics, max_batch_size: int, timeout_s: float):
        from ray import serve

        self.name = name
        self.metrics = metrics

        async def run(items: list[tuple[LoadedPolicy, np.ndarray]]) -> list[Any]:
            return self.forward(items)

        self.submit = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=timeout_s)(run)

    def configure(self, max_batch_size: int, timeout_s: float) -> None:
        self.submit.set_max_batch_size(max_batch_size)
        self.submit.set_batch_wait_timeout_s(timeout_s)

    def forward(self, items: list[tuple[LoadedPolicy, np.ndarray]]) -> list[Any]:
        pol = items[0][0]
        if all(p is pol for p, _ in items):
            return self._run(pol, np.stack([o for _, o in items]), len(items))
        out: list[Any] = [None] * len(items)
        groups: dict[int, list[int]] = {}
        for i, (p, _) in enumerate(items):
            groups.setdefault(id(p), []).append(i)
        for idxs in groups.values():
            p = items[idxs[0]][0]
            for i, a in zip(idxs, self._run(p, np.stack([items[i][1] for i in idxs]), len(idxs))):
                out[i] = a
        return out

    def _run(self, pol: LoadedPolicy, batch: np.ndarray, n: int) -> list[Any]:
        t0 = time.perf_counter()
        try:
            actions = pol.act(batch)
        except Exception as e:  # reported by the caller (a candidate falls back to the champion)
            return [Failed(e)] * n
        self.metrics.forward(self.name, len(batch), (time.perf_counter() - t0) * 1e3)
        return actions


# ------------------------------------------------------------------------------------------------ shadow


class ShadowWorker:
    """Runs the candidate on mirrored inputs in a thread, off the request path, and counts agreement.

    Items: (session id or None, frame or None, new episode, observation(s) or None, champion action(s), batch).
    The candidate keeps its own frame stacks per mirrored session (frames are pushed here, in order).
    """

    def __init__(self, name: str, version: Version, metrics: ServerMetrics):
        self.name = name
        self.version = version
        self.metrics = metrics
        self.q: queue.Queue = queue.Queue(SHADOW_QUEUE)
        self._stopped = False
        self.thread = threading.Thread(target=self._run, name=f"shadow-{name}", daemon=True)
        self.thread.start()

    def offer(self, item: tuple) -> None:
        try:
            self.q.put_nowait(item)
        except queue.Full:
            self.version.stats.dropped += 1
            self.metrics.shadow_outcome(self.name, "dropped")

    def stop(self) -> None:
        self._stopped = True
        try:
            self.q.put_nowait(None)
        except queue.Full:
            pass
        self.thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stopped:
            item = self.q.get()
            if item is None:
                return
            items, rows = [item], (len(item[3]) if item[5] else 1)
            until = time.monotonic() + SHADOW_LINGER_S
            while rows < SHADOW_BATCH:
                try:
                    nxt = self.q.get(timeout=max(0.0, until - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    self._stopped = True
                    break
                items.append(nxt)
                rows += len(nxt[3]) if nxt[5] else 1
            try:
                self._compare(items)
            except Exception:  # never let the worker die: count the batch as errors
                logger.exception("policy %r: shadow comparison failed", self.name)
                n = sum(len(i[4]) if i[5] else 1 for i in items)
                self.version.stats.shadow_errors += n
                self.metrics.shadow_outcome(self.name, "error", n)

    def _compare(self, items: list[tuple]) -> None:
        pol = self.version.pol
        obs, want = [], []
        for sid, frame, new, o, action, is_batch in items:
            if frame is not None:
                o = pol.sessions.push(sid, frame, new)[0] if pol.sessions is not None else o
            if is_batch:
                obs.extend(o)
                want.extend(action)
            else:
                obs.append(o)
                want.append(action)
        n = len(want)
        stats = self.version.stats
        try:
            got = pol.act(np.stack(obs))
        except Exception as e:
            if stats.shadow_errors == 0:
                logger.error("policy %r: shadow candidate failed: %s: %s", self.name, type(e).__name__, e)
            stats.shadow_errors += n
            self.metrics.shadow_outcome(self.name, "error", n)
            return
        agree = sum(1 for a, b in zip(got, want) if _same_action(a, b))
        stats.compared += n
        stats.agreed += agree
        if agree:
            self.metrics.shadow_outcome(self.name, "agree", agree)
        if n - agree:
            self.metrics.shadow_outcome(self.name, "disagree", n - agree)


def _same_action(a: Any, b: Any) -> bool:
    if a == b:
        return True
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):  # Box: float means
        return bool(np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6))
    return False


# ------------------------------------------------------------------------------------------------ loading


@dataclass
class Loaded:
    """What a reconfigure loaded for one policy name (objects of the current versions are reused)."""

    champion: LoadedPolicy
    candidate: LoadedPolicy | None
    spec: CandidateSpec | None
    candidate_error: dict[str, Any] | None
    loads: int = 0  # checkpoints actually loaded for this (the rest reused)


def changed(cur: LoadedPolicy, ckpt: str, limits: ServingLimits) -> bool:
    """Whether `ckpt` (resolved now: a registry alias may have moved) is not what `cur` serves. Blocking I/O."""
    if cur.limits != limits:
        return True
    try:
        resolved, registry = resolve_source(ckpt)
    except CheckpointError:
        return True  # let load() raise the readable error
    if resolved.location != cur.checkpoint or resolved.metadata is None or registry != cur.source.registry:
        return True
    return resolved.metadata.checkpoint_id != cur.checkpoint_id


def compatible(champion: LoadedPolicy, candidate: LoadedPolicy) -> str | None:
    """None when the candidate can stand in for the champion (same spaces and frame stacking), else why not."""
    if candidate.observation_space != champion.observation_space:
        return (f"candidate serves another env: observation space {candidate.observation_space} "
                f"(env {candidate.env}), the champion's is {champion.observation_space} (env {champion.env})")
    if candidate.action_space != champion.action_space:
        return (f"candidate serves another env: action space {candidate.action_space} (env {candidate.env}), "
                f"the champion's is {champion.action_space} (env {champion.env})")
    if candidate.framestack != champion.framestack or candidate.frame_shape != champion.frame_shape:
        return f"candidate stacks {candidate.framestack} frames, the champion {champion.framestack}"
    return None


async def load_versions(name: str, ckpt: str, spec: CandidateSpec | None, cur: "PolicyVersions | None",
                        limits: ServingLimits, cache_dir: str, metrics: ServerMetrics) -> Loaded:
    """Load what changed for one policy, off the event loop. The champion's load error is raised
    (CheckpointError); the candidate's is returned in `candidate_error` (the champion keeps serving).

    Reuse: the champion slot takes the current champion or, on promote (the champion's checkpoint is now the
    former candidate's), the loaded candidate itself: no reload, its sessions and frame stacks kept. Changing
    only weight, mode or rollout reloads nothing."""
    cur_champ = cur.champion.pol if cur and cur.champion else None
    cur_cand = cur.candidate.pol if cur and cur.candidate else None
    loaded: list[LoadedPolicy] = []

    async def get(path: str, options: list[LoadedPolicy | None]) -> LoadedPolicy:
        for pol in options:
            if pol is not None and not await asyncio.to_thread(changed, pol, path, limits):
                return pol
        pol = await asyncio.to_thread(LoadedPolicy.load, name, path, limits, cache_dir)
        loaded.append(pol)
        metrics.reload(name, ok=True)
        return pol

    try:
        champion = await get(ckpt, [cur_champ, cur_cand])
        candidate, error = None, None
        if spec is not None:
            try:
                candidate = await get(spec.checkpoint, [cur_cand if cur_cand is not champion else None])
                why = compatible(champion, candidate)
                if why:
                    raise CheckpointError(f"{candidate.checkpoint}: {why}")
            except CheckpointError as e:
                from rl_checkpoint import redact

                metrics.reload(name, ok=False)
                logger.error("policy %r: candidate %s", name, e)
                if candidate is not None and candidate in loaded:
                    candidate.release()
                    loaded.remove(candidate)
                candidate = None
                error = {"checkpoint": redact(spec.checkpoint), "error": str(e), "at": time.time()}
    except BaseException:
        for pol in loaded:
            pol.release()
        raise
    return Loaded(champion, candidate, spec, error, len(loaded))


# ------------------------------------------------------------------------------------------------ one policy


class PolicyVersions:
    """The versions served under one policy name in this replica, and the per-request logic between them."""

    def __init__(self, name: str, metrics: ServerMetrics, limits: ServingLimits, max_batch_size: int,
                 batch_wait_timeout_s: float):
        self.name = name
        self.metrics = metrics
        self.champion: Version | None = None
        self.candidate: Version | None = None
        self.spec: CandidateSpec | None = None
        self.candidate_error: dict[str, Any] | None = None
        self.sessions = Assignments(limits.max_sessions, limits.session_ttl_s)
        self.sessions.on_drop = self._abandon
        self.log: TransitionLog | None = None  # the replica's transition log while user_config.log is on
        self.shadow: ShadowWorker | None = None
        self.batcher = Batcher(name, metrics, max_batch_size, batch_wait_timeout_s)
        self.loads = 0  # checkpoints loaded for this policy in this replica (reused versions are not loads)

    # -------------------------------------------------------------- reconfigure

    def apply(self, new: Loaded, limits: ServingLimits) -> list[LoadedPolicy]:
        """Serve `new` from now on. -> the policy objects no longer served (to release)."""
        old_champ, old_cand, old_spec = self.champion, self.candidate, self.spec
        self.loads += new.loads
        promoted = old_cand is not None and new.champion is old_cand.pol
        if old_champ is not None and new.champion is old_champ.pol:
            champ = old_champ
        elif promoted:
            champ = old_cand
        else:
            champ = Version(new.champion)
            if old_champ is not None:
                new.champion.carry_sessions_from(old_champ.pol)
        cand = None
        if new.candidate is not None:
            cand = old_cand if old_cand is not None and new.candidate is old_cand.pol and not promoted \
                else Version(new.candidate)
        was_shadow = old_cand is not None and old_spec is not None and old_spec.shadow
        if self.shadow is not None and (cand is None or cand is not old_cand or not new.spec.shadow):
            self.shadow.stop()  # before its frame stacks move (below)
            self.shadow = None
        # Sessions follow their version where it still serves; else they continue on the champion.
        if promoted and old_champ is not None and old_champ is not champ:
            _absorb(champ.pol, old_champ.pol, override=True)
        if old_cand is not None and old_cand is not champ and (cand is not old_cand or new.spec.shadow):
            if not was_shadow:  # split: the candidate's sessions had their stacks there
                _absorb(champ.pol, old_cand.pol, override=False)
        for _, s in self.sessions.with_role(CANDIDATE):
            if cand is None or cand is not old_cand or new.spec.shadow:
                self.sessions.set_role(s, CHAMPION)
        self.sessions.configure(limits)
        self.champion, self.candidate, self.spec = champ, cand, new.spec if cand is not None else None
        self.candidate_error = new.candidate_error
        if cand is not None and new.spec.shadow and self.shadow is None:
            self.shadow = ShadowWorker(self.name, cand, self.metrics)
        self._report(old_champ, old_cand, old_spec)
        kept = {id(champ.pol)} | ({id(cand.pol)} if cand else set())
        return [v.pol for v in (old_champ, old_cand) if v is not None and id(v.pol) not in kept]

    def _report(self, old_champ: Version | None, old_cand: Version | None, old_spec: CandidateSpec | None) -> None:
        m, spec = self.metrics, self.spec
        champ, cand = self.champion, self.candidate
        prev = (old_champ.pol.checkpoint_id, None) if old_champ else None
        m.version_loaded(self.name, CHAMPION, champ.pol.checkpoint_id, None, prev,
                         spec.role_weight(CHAMPION) if spec else 1.0)
        if cand is not None:
            prev = (old_cand.pol.checkpoint_id, old_spec.mode) if old_cand and old_spec else None
            m.version_loaded(self.name, CANDIDATE, cand.pol.checkpoint_id, spec.mode, prev, spec.weight)
        elif old_cand is not None and old_spec is not None:
            m.version_gone(self.name, CANDIDATE, old_cand.pol.checkpoint_id, old_spec.mode)
        self._set_session_gauges()

    def policies(self) -> list[LoadedPolicy]:
        return [v.pol for v in (self.champion, self.candidate) if v is not None]

    def stop(self) -> None:
        """The policy is no longer served here (removed, or the replica stops)."""
        if self.shadow is not None:
            self.shadow.stop()
            self.shadow = None
        for sid, s in self.sessions.items():
            self._abandon(sid, s)

    def _abandon(self, sid: str, s: Session) -> None:
        if s.log is not None and self.log is not None:
            self.log.abandon(self.name, sid, s.log)
        s.log = None

    def _set_session_gauges(self) -> None:
        self.sessions.changed = False
        for role, n in self.sessions.counts.items():
            self.metrics.set_version_sessions(self.name, role, n)

    # -------------------------------------------------------------- assignment

    def _choose(self, sid: str) -> tuple[str, bool]:
        spec = self.spec
        if self.candidate is None or spec is None or spec.weight <= 0.0:
            return CHAMPION, False
        inside = hash01(sid) < spec.weight
        if spec.shadow:
            return CHAMPION, inside
        return (CANDIDATE if inside else CHAMPION), False

    def _split_one(self) -> str:
        spec = self.spec
        if self.candidate is not None and not spec.shadow and spec.weight > 0.0 and random.random() < spec.weight:
            return CANDIDATE
        return CHAMPION

    def _mirror_one(self) -> bool:
        spec = self.spec
        return self.shadow is not None and spec.weight > 0.0 and random.random() < spec.weight

    # -------------------------------------------------------------- act

    async def act(self, body: Mapping[str, Any], t0: float, batch_now: Callable[[], Any]) -> dict[str, Any]:
        """One observation (or one frame of a session) -> the acting version's greedy action.

        `batch_now()` is awaited after validation: truthy -> join the dynamic batch, else run directly."""
        unknown = set(body) - set(ACT_FIELDS)
        if unknown:
            raise bad_request("unknown_field", f"unknown field(s) {sorted(unknown)}; allowed: {list(ACT_FIELDS)}")
        champ = self.champion
        sid = body.get("session_id")
        if sid is not None and (not isinstance(sid, str) or not 0 < len(sid) <= SESSION_ID_MAX_LEN):
            raise bad_request("bad_session_id", f"'session_id' must be a string of 1-{SESSION_ID_MAX_LEN} chars")
        reset = body.get("reset", False)
        if not isinstance(reset, bool):
            raise bad_request("bad_reset", "'reset' must be true or false")
        frame = None
        if "observation" in body:
            if "frame" in body:
                raise bad_request("ambiguous_input", "send either 'observation' or 'frame', not both")
            obs = champ.pol.observation(body["observation"])
        elif "frame" in body:
            if sid is None:
                raise bad_request("missing_session_id",
                                  f"'frame' needs a 'session_id' string (1-{SESSION_ID_MAX_LEN} chars)")
            frame = champ.pol.frame(body["frame"])
        else:
            raise bad_request(
                "missing_observation",
                "body needs 'observation'" + (" or 'frame' + 'session_id'" if champ.pol.framestack > 1 else "")
                + f"; got fields {sorted(body)}",
            )
        out: dict[str, Any] = {}
        sess = None
        if sid is not None:
            sess, new = self.sessions.open(sid, self._choose)
            if new and self.log is not None:
                sess.log = self.log.start(sid)
            sess.frames = frame is not None
            if reset and not new:
                sess.ret = 0.0  # a new episode in the same session: the return so far is dropped
            if self.sessions.changed:
                self._set_session_gauges()
            role = sess.role
        else:
            new, role = False, self._split_one()
        cand = self.candidate
        ver = cand if role == CANDIDATE and cand is not None else champ
        if frame is not None:
            stacks = ver.pol.sessions
            obs, fnew, count = stacks.push(sid, frame, reset or new)
            self.metrics.set_sessions(self.name, len(stacks))
            out["session"] = {"id": sid, "new": fnew, "frames": count}
        elif sess is not None:
            out["session"] = {"id": sid, "new": new}
        if await batch_now():
            action = await self.batcher.submit((ver.pol, obs))
        else:
            action = self.batcher.forward([(ver.pol, obs)])[0]
        if type(action) is Failed:
            if ver is champ:
                self._failed(champ, CHAMPION, action.exc)
                raise action.exc
            self._failed(ver, CANDIDATE, action.exc)
            if sess is not None:  # pinned to the champion for the rest of the episode, frame stack included
                self.sessions.set_role(sess, CHAMPION)
                if frame is not None:
                    champ.pol.sessions.put(sid, ver.pol.sessions.take(sid))
                self._set_session_gauges()
            ver, role = champ, CHAMPION
            action = self.batcher.forward([(champ.pol, obs)])[0]
            if type(action) is Failed:
                self._failed(champ, CHAMPION, action.exc)
                raise action.exc
        out.update(action=action, policy=self.name, checkpoint_id=ver.pol.checkpoint_id, version=role)
        ms = (time.perf_counter() - t0) * 1e3
        ver.stats.answered(ms)
        self.metrics.version_request(self.name, role, True, ms)
        if self.shadow is not None and (sess.mirror if sess is not None else self._mirror_one()):
            self.shadow.offer((sid, frame, reset or new, obs, action, False))
        if sess is not None and sess.log is not None and self.log is not None:
            sess.log = self.log.act(self.name, sid, sess.log, reset or new, obs if frame is None else frame, action,
                                    role, ver.pol.checkpoint_id)
        return out

    def act_batch(self, body: Mapping[str, Any], t0: float) -> dict[str, Any]:
        unknown = set(body) - {"observations"}
        if unknown:
            raise bad_request("unknown_field", f"unknown field(s) {sorted(unknown)}; allowed: ['observations']")
        if "observations" not in body:
            raise bad_request("missing_observations", f"body needs 'observations' (a list); got fields {sorted(body)}")
        champ = self.champion
        obs = champ.pol.observations(body["observations"])
        role = self._split_one()
        ver = self.candidate if role == CANDIDATE else champ
        actions = self.batcher._run(ver.pol, obs, len(obs))
        if actions and type(actions[0]) is Failed:
            self._failed(ver, role, actions[0].exc)
            if ver is champ:
                raise actions[0].exc
            ver, role = champ, CHAMPION
            actions = self.batcher._run(champ.pol, obs, len(obs))
            if actions and type(actions[0]) is Failed:
                self._failed(champ, CHAMPION, actions[0].exc)
                raise actions[0].exc
        ms = (time.perf_counter() - t0) * 1e3
        ver.stats.answered(ms)
        self.metrics.version_request(self.name, role, True, ms)
        if self._mirror_one():
            self.shadow.offer((None, None, False, obs, actions, True))
        return {"actions": actions, "policy": self.name, "checkpoint_id": ver.pol.checkpoint_id, "version": role}

    def _failed(self, ver: Version, role: str, exc: BaseException) -> None:
        ver.stats.failed()
        ver.failures += 1
        self.metrics.version_request(self.name, role, False, None)
        if ver.failures == 1 or ver.failures % 100 == 0:
            logger.error("policy %r: %s %s failed to act (%d failures so far): %s: %s", self.name, role,
                         ver.pol.checkpoint_id, ver.failures, type(exc).__name__, exc)

    # -------------------------------------------------------------- sessions and feedback

    def end_session(self, sid: str) -> bool:
        """DELETE /sessions/ID: the session ends (its unfinished episode is not counted)."""
        ended = self.sessions.end(sid) is not None
        for ver in (self.champion, self.candidate):
            if ver is not None and ver.pol.sessions is not None:
                ended = ver.pol.sessions.end(sid) or ended
        if self.champion.pol.sessions is not None:
            self.metrics.set_sessions(self.name, len(self.champion.pol.sessions))
        if self.sessions.changed:
            self._set_session_gauges()
        return ended

    def feedback(self, body: Mapping[str, Any], max_items: int) -> dict[str, Any]:
        """Rewards for sessions that acted here; done=true ends the episode. The whole request is validated
        (fields, then sessions) before anything is applied."""
        try:
            items = _feedback_items(body, max_items)
        except ApiError:
            self.metrics.feedback(self.name, "invalid")
            raise
        sessions: list[Session] = []
        finals: list[np.ndarray | None] = []
        done_here: set[str] = set()
        for i, (sid, _, done, _, final) in enumerate(items):
            where = f"feedback[{i}]" if "feedback" in body else "feedback"
            s = self.sessions.get(sid)
            if s is None or sid in done_here:
                if sid in done_here or self.sessions.was_ended(sid):
                    self.metrics.feedback(self.name, "session_ended")
                    raise ApiError(409, "session_ended",
                                   f"{where}: session {sid!r} already ended (done=true or DELETE); a new episode "
                                   f"starts with an act request", {"session_id": sid})
                self.metrics.feedback(self.name, "unknown_session")
                raise ApiError(404, "unknown_session",
                               f"{where}: session {sid!r} has not acted on policy {self.name!r} in this replica "
                               f"(or expired: idle over session_ttl_s, or evicted beyond max_sessions)",
                               {"session_id": sid})
            if done:
                done_here.add(sid)
            sessions.append(s)
            finals.append(None if final is None else self._final_observation(where, s, final))
        ended = 0
        log = self.log
        for (sid, reward, done, truncated, _), s, final in zip(items, sessions, finals):
            s.ret += reward
            if log is not None and s.log is not None:
                log.reward(s.log, reward)
                if done:
                    log.end(self.name, sid, s.log, truncated, final)
                    s.log = None
            if done:
                ver = self.candidate if s.role == CANDIDATE and self.candidate is not None else self.champion
                st = ver.stats
                st.episodes += 1
                st.return_sum += s.ret
                st.return_sq_sum += s.ret * s.ret
                self.metrics.episode(self.name, s.role, s.ret)
                self.end_session(sid)
                ended += 1
            else:
                self.sessions.touch(sid, s)
        self.metrics.feedback(self.name, "ok", len(items))
        return {"accepted": len(items), "episodes_ended": ended}

    def _final_observation(self, where: str, s: Session, value: Any) -> np.ndarray:
        """A done feedback's final observation, validated like the session's act input (a frame or not)."""
        pol = self.champion.pol
        try:
            return pol.frame(value) if s.frames else pol.observation(value)
        except ApiError as e:
            self.metrics.feedback(self.name, "invalid")
            raise ApiError(e.status, e.code, f"{where}.observation: {e.message}", e.detail) from None

    # -------------------------------------------------------------- description

    def stats(self, replica: str) -> dict[str, Any]:
        spec = self.spec
        versions = {CHAMPION: self._version_stats(self.champion, CHAMPION)}
        if self.candidate is not None:
            c = self._version_stats(self.candidate, CANDIDATE)
            st = self.candidate.stats
            c["shadow"] = {"compared": st.compared, "agreed": st.agreed, "dropped": st.dropped,
                           "errors": st.shadow_errors}
            versions[CANDIDATE] = c
        return {"policy": self.name, "replica": replica, "at": time.time(), "loads": self.loads, "versions": versions,
                **({"candidate_error": self.candidate_error} if self.candidate_error else {}),
                "rollout": dict(spec.rollout) if spec is not None and spec.rollout is not None else None}

    def _version_stats(self, ver: Version, role: str) -> dict[str, Any]:
        spec, st = self.spec, ver.stats
        self.sessions.expire(time.monotonic())
        return {"checkpoint_id": ver.pol.checkpoint_id,
                "weight": spec.role_weight(role) if spec else 1.0,
                "mode": spec.mode if role == CANDIDATE and spec else None,
                "requests": st.requests, "errors": st.errors, "latency_ms": st.latency(),
                "episodes": st.episodes, "return_sum": st.return_sum, "return_sq_sum": st.return_sq_sum,
                "active_sessions": self.sessions.counts[role], "loaded_at": ver.pol.loaded_at}

    def info(self) -> dict[str, Any]:
        """The champion's description plus `candidate` (or null), `candidate_error` when it failed to load."""
        info = self.champion.pol.info()
        cand, spec = self.candidate, self.spec
        info["candidate"] = None if cand is None else {
            "checkpoint_id": cand.pol.checkpoint_id, "checkpoint": cand.pol.checkpoint, "weight": spec.weight,
            "mode": spec.mode, "registry": cand.pol.source.registry, "evaluation": cand.pol.source.evaluation,
            "loaded_at": cand.pol.loaded_at}
        if self.candidate_error:
            info["candidate_error"] = self.candidate_error
        return info


def _absorb(into: LoadedPolicy, src: LoadedPolicy, override: bool) -> None:
    if into.sessions is not None and src.sessions is not None and into.sessions is not src.sessions:
        into.sessions.absorb(src.sessions, override)


def _feedback_items(body: Mapping[str, Any], max_items: int) -> list[tuple[str, float, bool, bool, Any]]:
    if "feedback" in body:
        extra = set(body) - {"feedback"}
        if extra:
            raise bad_request("unknown_field", f"unknown field(s) {sorted(extra)} next to 'feedback'; the batch "
                                               f"form is {{\"feedback\": [{{session_id, reward, done}}, ...]}}")
        raw = body["feedback"]
        if not isinstance(raw, list):
            raise bad_request("bad_feedback", f"'feedback' must be a list of {{session_id, reward, done}} objects, "
                                              f"got {type(raw).__name__}")
        if not raw:
            raise unprocessable("empty_batch", "'feedback' is an empty list")
        if len(raw) > max_items:
            raise ApiError(413, "batch_too_large", f"batch of {len(raw)} feedback items exceeds the limit of "
                                                   f"{max_items} (max_batch_items)")
        return [_feedback_item(f"feedback[{i}]", item) for i, item in enumerate(raw)]
    return [_feedback_item("feedback", body)]


def _feedback_item(where: str, item: Any) -> tuple[str, float, bool, bool, Any]:
    """-> (session id, reward, done, truncated, final observation as sent or None); the observation is
    validated against the session's policy later (PolicyVersions._final_observation)."""
    if not isinstance(item, Mapping):
        raise bad_request("bad_feedback", f"{where} must be an object {{session_id, reward, done}}, "
                                          f"got {type(item).__name__}")
    unknown = set(item) - set(FEEDBACK_FIELDS)
    if unknown:
        raise bad_request("unknown_field", f"{where}: unknown field(s) {sorted(unknown)}; allowed: "
                                           f"{list(FEEDBACK_FIELDS)}")
    sid = item.get("session_id")
    if sid is None:
        raise bad_request("missing_session_id", f"{where}.session_id is missing")
    if not isinstance(sid, str) or not 0 < len(sid) <= SESSION_ID_MAX_LEN:
        raise bad_request("bad_session_id", f"{where}.session_id must be a string of 1-{SESSION_ID_MAX_LEN} chars")
    if "reward" not in item:
        raise bad_request("missing_reward", f"{where}.reward is missing")
    reward = item["reward"]
    try:
        value = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else math.nan
    except OverflowError:  # an integer beyond float range
        value = math.nan
    if not math.isfinite(value):
        raise unprocessable("bad_reward", f"{where}.reward must be a finite number, got {str(reward)[:40]}")
    done = item.get("done", False)
    if not isinstance(done, bool):
        raise unprocessable("bad_done", f"{where}.done must be true or false, got {done!r}")
    truncated = item.get("truncated", False)
    if not isinstance(truncated, bool):
        raise unprocessable("bad_truncated", f"{where}.truncated must be true or false, got {truncated!r}")
    if "observation" in item and item["observation"] is None:
        raise unprocessable("bad_observation", f"{where}.observation is null; leave it out when there is none")
    if (truncated or "observation" in item) and not done:
        field_ = "truncated" if truncated else "observation"
        raise unprocessable(f"bad_{field_}", f"{where}.{field_} describes how the episode ended: it needs "
                                             f"done=true")
    return sid, value, done, truncated, item.get("observation")
