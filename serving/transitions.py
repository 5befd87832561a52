"""Transition logging: what sessions saw, did and earned, written as Parquet in RLlib's offline column format.

One row per transition, the columns RLlib's OfflineEnvRunner writes with `output_write_episodes=False` (so
`OfflinePreLearner` reads the files as they are) plus who acted; see serving/README.md, "Transition log". A step
is complete when the session's next act arrives (new_obs = that observation), when feedback says done
(terminated, or truncated when it says so) or when the session goes away mid-episode (DELETE, expiry, eviction,
a new episode, the policy removed, shutdown: truncated, new_obs = obs). Rewards are the feedback received
between a step and the next.

Never in the way of a request: the request path only appends a tuple to a bounded deque (full: the row is
dropped and counted). A writer thread turns rows into Parquet and writes them through `rl_checkpoint.Storage`
(local path or object store), every `flush_rows` rows or `flush_interval_s`; a failed write keeps its rows (they
still count against `max_buffer`), is logged once per outage and retried after `retry_s`.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
import uuid
from typing import Any

import numpy as np

from serving.config import TransitionLogConfig

logger = logging.getLogger("ray.serve")

SCHEMA_VERSION = 1
# Greedy serving: the behaviour policy picks its action with probability 1, so log(1).
ACTION_LOGP = 0.0
# Sampling hashes the session id with this salt: the split's own hash would log exactly its candidate's sessions.
_SALT = b"transition-log:"
_CLOSE_TIMEOUT_S = 10.0


def sampled(session_id: str, rate: float) -> bool:
    """Whether a session is logged: reproducible in every replica, whole sessions only."""
    if rate >= 1.0:
        return True
    h = hashlib.blake2b(_SALT + session_id.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0 ** 64 < rate


class Episode:
    """A logged session's episode: its id, step index and the step still waiting for what came next."""

    __slots__ = ("eps_id", "t", "step")

    def __init__(self) -> None:
        self.eps_id = uuid.uuid4().hex
        self.t = 0
        self.step: list | None = None  # [obs, action, reward, version, checkpoint_id, time]


class TransitionLog:
    """Per replica: turns session events into rows for the writer. Called on the event loop only."""

    def __init__(self, cfg: TransitionLogConfig, replica: str, metrics: Any):
        self.cfg = cfg
        self.writer = ParquetWriter(cfg, replica, metrics)

    def start(self, session_id: str) -> Episode | None:
        """A session's first request: its first episode if the session is sampled, else None (never logged)."""
        return Episode() if sampled(session_id, self.cfg.sample_rate) else None

    def act(self, policy: str, sid: str, ep: Episode, new_episode: bool, obs: np.ndarray, action: Any,
            version: str, checkpoint_id: str) -> Episode:
        """The session acted on `obs`: completes its pending step (or truncates it on a new episode)."""
        if ep.step is not None:
            if new_episode:
                self._emit(policy, sid, ep, None, False, True)
                ep = Episode()
            else:
                self._emit(policy, sid, ep, obs, False, False)
                ep.t += 1
        ep.step = [obs, action, 0.0, version, checkpoint_id, time.time()]
        return ep

    @staticmethod
    def reward(ep: Episode, reward: float) -> None:
        if ep.step is not None:
            ep.step[2] += reward

    def end(self, policy: str, sid: str, ep: Episode, truncated: bool, final_obs: np.ndarray | None) -> None:
        """Feedback done=true: the pending step is the episode's last."""
        if ep.step is not None:
            self._emit(policy, sid, ep, final_obs, not truncated, truncated)

    def abandon(self, policy: str, sid: str, ep: Episode) -> None:
        """The session went away mid-episode: its pending step is written as truncated."""
        if ep.step is not None:
            self._emit(policy, sid, ep, None, False, True)

    def _emit(self, policy: str, sid: str, ep: Episode, new_obs: np.ndarray | None, terminated: bool,
              truncated: bool) -> None:
        obs, action, reward, version, ckpt, at = ep.step
        ep.step = None
        self.writer.offer((policy, version, ckpt, sid, ep.eps_id, ep.t, obs, action, reward,
                           obs if new_obs is None else new_obs, terminated, truncated, at))

    def close(self) -> None:
        self.writer.close()


# ------------------------------------------------------------------------------------------------ writer


class ParquetWriter:
    """Bounded buffer + writer thread: `<uri>/<policy>/<replica>-<unix ms>-<seq>.parquet`, one file per policy
    (and observation layout) per flush."""

    def __init__(self, cfg: TransitionLogConfig, replica: str, metrics: Any):
        self.cfg = cfg
        self.replica = replica
        self.metrics = metrics
        self.rows: collections.deque = collections.deque()
        self.inflight = 0  # rows taken by the writer and not yet written (they still hold their buffer space)
        self.seq = 0
        self.failing = False
        self._storage = None
        self._wake = threading.Event()  # rows to write (flush_rows reached, a reload, close)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="transition-log", daemon=True)
        self.thread.start()

    def offer(self, row: tuple) -> None:
        n = len(self.rows)
        if n + self.inflight >= self.cfg.max_buffer:
            self.metrics.log_rows(row[0], "dropped")
            return
        self.rows.append(row)
        if n + 1 >= self.cfg.flush_rows:
            self._wake.set()

    def flush(self) -> None:
        """Write what waits now (a reload), without waiting for it."""
        self._wake.set()

    def close(self) -> None:
        """Write what waits (one try) and stop."""
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=_CLOSE_TIMEOUT_S)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.cfg.flush_interval_s)
            self._wake.clear()
            stopping = self._stop.is_set()
            if self.rows and not self._write_all() and not stopping:
                self._stop.wait(self.cfg.retry_s)  # the store failed: not again before retry_s, however many rows
            if stopping:
                return

    def _write_all(self) -> bool:
        n = self.inflight = len(self.rows)  # counted before they leave the deque: the bound holds meanwhile
        rows = [self.rows.popleft() for _ in range(n)]  # only this thread removes rows
        groups: dict[tuple, list[tuple]] = {}
        for r in rows:
            obs, action = r[6], r[7]
            groups.setdefault((r[0], obs.shape, obs.dtype.str, type(action)), []).append(r)
        unwritten: list[tuple] = []
        for key, group in groups.items():
            if unwritten:  # the store failed on an earlier group: do not try it again now
                unwritten += group
                continue
            try:
                self._write(key[0], group)
            except Exception as e:  # any store or conversion error: keep the rows, keep serving
                self.metrics.log_files(key[0], "failed")
                if not self.failing:
                    logger.error("transition log: cannot write to %s (%s: %s); rows are kept (up to max_buffer=%d) "
                                 "and retried every %gs", _redacted(self.cfg.uri), type(e).__name__, e,
                                 self.cfg.max_buffer, self.cfg.retry_s)
                self.failing = True
                self._storage = None  # reopened on the next try (a new connection)
                unwritten += group
                continue
            self.metrics.log_files(key[0], "written")
            self.metrics.log_rows(key[0], "written", len(group))
        if unwritten:
            self.rows.extendleft(reversed(unwritten))
        elif self.failing:
            logger.warning("transition log: writing to %s again", _redacted(self.cfg.uri))
            self.failing = False
        self.inflight = 0
        return not unwritten

    def _write(self, policy: str, rows: list[tuple]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from rl_checkpoint import Storage

        sink = pa.BufferOutputStream()
        pq.write_table(to_table(rows), sink)
        if self._storage is None:
            self._storage = Storage.open(self.cfg.uri)
        self.seq += 1
        name = f"{self.replica}-{int(time.time() * 1000)}-{self.seq:06d}.parquet"
        self._storage.write_bytes(sink.getvalue().to_pybytes(), policy, name)


def _redacted(uri: str | None) -> str:
    from rl_checkpoint import redact

    return redact(uri or "")


def _nested(arr: np.ndarray) -> Any:
    """(N, d1, ..., dk) -> an Arrow array of N nested lists (k levels) of arr's dtype; (N,) -> a flat array."""
    import pyarrow as pa

    values = pa.array(arr.reshape(-1))
    for d in reversed(arr.shape[1:]):
        offsets = np.arange(0, len(values) + 1, d, dtype=np.int32)
        values = pa.ListArray.from_arrays(pa.array(offsets), values)
    return values


def to_table(rows: list[tuple]) -> Any:
    """Rows of one policy and observation layout -> the schema-version-1 table (serving/README.md)."""
    import pyarrow as pa

    n = len(rows)
    col = list(zip(*rows))
    (policy, version, ckpt, sid, eps_id, t, obs, action, reward, new_obs, term, trunc, at) = col
    actions = np.asarray(action)
    actions = actions.astype(np.int64 if actions.dtype.kind in "iub" else np.float32)
    table = pa.table({
        "eps_id": pa.array(eps_id, pa.string()),
        "agent_id": pa.nulls(n),
        "module_id": pa.nulls(n),
        "obs": _nested(np.stack(obs)),
        "new_obs": _nested(np.stack(new_obs)),
        "actions": _nested(actions),
        "rewards": pa.array(reward, pa.float64()),
        "terminateds": pa.array(term, pa.bool_()),
        "truncateds": pa.array(trunc, pa.bool_()),
        "t": pa.array(t, pa.int64()),
        "action_logp": pa.array(np.full(n, ACTION_LOGP, np.float32)),
        "policy": pa.array(policy, pa.string()),
        "version": pa.array(version, pa.string()),
        "checkpoint_id": pa.array(ckpt, pa.string()),
        "session_id": pa.array(sid, pa.string()),
        "time": pa.array(at, pa.float64()),
    })
    return table.replace_schema_metadata({"schema_version": str(SCHEMA_VERSION)})
