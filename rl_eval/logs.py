"""Logged transitions as data: find a transition log's Parquet files, check them against an env's spaces, read
them back as episodes. Used by the trainer (`offline.input`, trainer.offline) and by off-policy estimates
(rl_eval.offline), so both refuse the same bad logs with the same message.

A row is one transition in RLlib's offline column format (what `ray.rllib.offline.offline_env_runner` writes
with output_write_episodes=False), which RLlib's OfflinePreLearner reads without conversion: `eps_id`, `obs`,
`new_obs`, `actions`, `rewards`, `terminateds`, `truncateds`, `t`, `action_logp`, plus provenance columns the
policy server adds (policy, version, checkpoint_id, session_id, time). Files: `<uri>/<policy>/*.parquet`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_checkpoint import CheckpointError, Storage, redact

# What training reads (RLlib's column names); the provenance columns would reach the learner as strings.
TRAINING_COLUMNS = ("eps_id", "obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "t")
# Off-policy estimates also need the behaviour policy's log-probability of the logged action.
ESTIMATE_COLUMNS = ("eps_id", "obs", "actions", "rewards", "terminateds", "truncateds", "t", "action_logp")


class LogError(Exception):
    """A transition log that cannot be used: one line naming the problem."""


@dataclass(frozen=True)
class TransitionLog:
    storage: Storage  # rooted at the location given
    files: tuple[str, ...]  # Parquet files, paths inside storage.fs, sorted

    @property
    def shown(self) -> str:
        return redact(self.storage.location)


def find_log(location: str, what: str = "transition log") -> TransitionLog:
    """The Parquet files at `location` (a file, or every *.parquet below a folder or URI prefix)."""
    import pyarrow.fs as pafs

    try:
        storage = Storage.open(location, create=False)
        info = storage.info()
    except CheckpointError as e:
        raise LogError(f"{what} {redact(location)}: {e}") from None
    if info.type == pafs.FileType.NotFound:
        raise LogError(f"{what} {redact(location)} does not exist")
    if info.type == pafs.FileType.File:
        files = [storage.root] if storage.root.endswith(".parquet") else []
    else:
        try:
            infos = storage.fs.get_file_info(pafs.FileSelector(storage.root, recursive=True))
        except OSError as e:
            raise LogError(f"{what} {redact(location)} cannot be listed: {e}") from None
        # Names starting with '.' or '_' are a writer's temporary or marker files, not data.
        files = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                       and not i.base_name.startswith((".", "_")))
    if not files:
        raise LogError(f"{what} {redact(location)} holds no .parquet files")
    return TransitionLog(storage, tuple(files))


def _value_shape(value: Any) -> tuple[int, ...]:
    return np.asarray(value).shape


def check_log(log: TransitionLog, obs_space: Any, act_space: Any, env: str, columns=TRAINING_COLUMNS) -> int:
    """The log's columns hold what an env with these spaces emits and takes; -> rows in the files checked.

    Cheap: the Parquet footers of the first and the newest file and one row of the first; a log whose schema
    changed in between shows in either. Raises LogError naming the file and the column."""
    import pyarrow.parquet as pq
    from gymnasium import spaces

    rows = 0
    for path in dict.fromkeys((log.files[0], log.files[-1])):
        where = f"{log.shown}: {path.rsplit('/', 1)[-1]}"
        try:
            with log.storage.fs.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                names = set(pf.schema_arrow.names)
                missing = [c for c in columns if c not in names]
                if missing:
                    raise LogError(f"{where} lacks column(s) {', '.join(missing)} (a transition log has "
                                   f"{', '.join(columns)})")
                rows += pf.metadata.num_rows
                if path != log.files[0]:
                    continue
                if pf.metadata.num_rows == 0:
                    raise LogError(f"{where} holds no rows")
                first = pf.read_row_group(0, columns=["obs", "actions"]).slice(0, 1).to_pylist()[0]
        except LogError:
            raise
        except Exception as e:  # noqa: BLE001 - not Parquet, truncated, unreadable store: say which file
            raise LogError(f"{where} is not a readable Parquet file ({type(e).__name__}: "
                           f"{(str(e).strip().splitlines() or [''])[0][:200]})") from None
        obs = np.asarray(first["obs"], dtype=np.float64) if first["obs"] is not None else None
        if obs is None or obs.shape != tuple(obs_space.shape):
            got = "null" if obs is None else f"shape {obs.shape}"
            raise LogError(f"{where}: column obs holds observations of {got}, env {env!r} emits shape "
                           f"{tuple(obs_space.shape)} (a log of another env?)")
        action = first["actions"]
        if isinstance(act_space, spaces.Discrete):
            ok = isinstance(action, (int, np.integer)) and not isinstance(action, bool)
            want = "an integer action"
        elif isinstance(act_space, spaces.MultiDiscrete):
            ok = (isinstance(action, list) and _value_shape(action) == tuple(act_space.shape)
                  and all(isinstance(a, int) for a in action))
            want = f"a list of {act_space.shape[0]} integer actions"
        else:
            ok = action is not None and _value_shape(action) == tuple(act_space.shape)
            want = f"actions of shape {tuple(act_space.shape)}"
        if not ok:
            raise LogError(f"{where}: column actions holds {action!r}, env {env!r} takes {want} "
                           f"({act_space}): a log of another env?")
    return rows


@dataclass
class LoggedEpisode:
    eps_id: str
    obs: np.ndarray  # [T, *obs_shape]
    actions: np.ndarray  # [T] or [T, n]
    rewards: np.ndarray  # [T]
    behaviour_logp: np.ndarray  # [T]: log-probability of the logged action under the policy that acted


def read_episodes(log: TransitionLog) -> tuple[list[LoggedEpisode], int]:
    """Complete episodes of the log (t = 0, 1, ... without a gap, the last row terminated or truncated), oldest
    transition first; -> (episodes, transitions skipped because their episode is incomplete: still open when the
    log was written, or sampled out)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in log.files:
        with log.storage.fs.open_input_file(path) as f:
            tables.append(pq.read_table(f, columns=list(ESTIMATE_COLUMNS)))
    table = pa.concat_tables(tables, promote_options="permissive")
    data = table.to_pydict()
    by_id: dict[str, list[int]] = {}
    for i, eps in enumerate(data["eps_id"]):
        by_id.setdefault(str(eps), []).append(i)
    episodes, skipped = [], 0
    for eps, rows in by_id.items():
        rows.sort(key=lambda i: data["t"][i])
        ts = [data["t"][i] for i in rows]
        last = rows[-1]
        if ts != list(range(len(rows))) or not (data["terminateds"][last] or data["truncateds"][last]):
            skipped += len(rows)
            continue
        logp = [data["action_logp"][i] for i in rows]
        episodes.append(LoggedEpisode(
            eps_id=eps,
            obs=np.asarray([data["obs"][i] for i in rows], dtype=np.float32),
            actions=np.asarray([data["actions"][i] for i in rows]),
            rewards=np.asarray([data["rewards"][i] for i in rows], dtype=np.float64),
            behaviour_logp=np.asarray([0.0 if v is None else v for v in logp], dtype=np.float64)))
    return episodes, skipped
