"""The checkpoint contract: how a run's checkpoints are laid out, what their metadata says, how to find one.

Writer: the trainer (plain loop and Tune). Reader: the policy server, the export tool, tests. Both import this
module and nothing else spells a path segment or a metadata key.

    <run>/state.json                      RunState: pointer to the latest complete checkpoint (+ resume data)
    <run>/checkpoints/iter_NNNNNN/        periodic, newest `keep` kept
    <run>/checkpoints/best/               best greedy-evaluation return so far (training return without evaluation)
    <run>/checkpoints/final/              at stop
    <ckpt>/rl_platform.json               CheckpointMetadata (versioned): env, frame stacking, stable id
    <ckpt>/learner_group/learner/rl_module/default_policy/   the RLModule (RLlib Algorithm checkpoint)

A bare RLModule directory (RLlib's `class_and_ctor_args.pkl` at its top) is a checkpoint too; metadata is
optional for it. Any location is a local path or a pyarrow URI (`Storage`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.storage import Storage, redact

FORMAT_VERSION = 1
POLICY_ID = "default_policy"
MODULE_DIR = f"learner_group/learner/rl_module/{POLICY_ID}"
METADATA_FILE = "rl_platform.json"
STATE_FILE = "state.json"
CHECKPOINTS_DIR = "checkpoints"
BEST, FINAL, LATEST = "best", "final", "latest"
SELECTORS = (LATEST, BEST, FINAL)
# RLlib writes this file at the top of every RLModule checkpoint; an Algorithm checkpoint has `learner_group/`.
_MODULE_MARKER = "class_and_ctor_args.pkl"
_ALGO_MARKER = MODULE_DIR.split("/", 1)[0]


def checkpoint_rel(name: str) -> str:
    """Run-relative path of checkpoint `name` (best, final or an iter_name)."""
    return f"{CHECKPOINTS_DIR}/{name}"


def iter_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


# --------------------------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class CheckpointMetadata:
    """What a server needs to know about a checkpoint besides the RLModule itself (rl_platform.json)."""

    checkpoint_id: str
    env: str | None = None
    env_config: dict[str, Any] = field(default_factory=dict)
    framestack: int = 1
    algo: str | None = None
    experiment: str | None = None
    iteration: int | None = None
    env_steps: int | None = None
    episode_return_mean: float | None = None
    # Mean return of the greedy evaluation of this checkpoint's iteration (None: not evaluated).
    eval_return_mean: float | None = None
    created: str | None = None
    policy_id: str = POLICY_ID
    module_dir: str = MODULE_DIR  # relative to the checkpoint root; "." for a bare RLModule directory
    format_version: int = FORMAT_VERSION

    @classmethod
    def new(cls, *, experiment: str, name: str, iteration: int, env_steps: int,
            episode_return_mean: float | None, eval_return_mean: float | None = None,
            **fields: Any) -> "CheckpointMetadata":
        """A fresh record with a unique, readable checkpoint_id and the creation time."""
        ident = f"{experiment}-{name}-iter{iteration}-steps{env_steps}"
        return cls(
            checkpoint_id=ident + "-" + hashlib.sha1(f"{ident}{time.time_ns()}".encode()).hexdigest()[:8],
            experiment=experiment, iteration=iteration, env_steps=env_steps,
            episode_return_mean=_number(episode_return_mean), eval_return_mean=_number(eval_return_mean),
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **fields,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Any, where: str) -> "CheckpointMetadata":
        """Validate a parsed rl_platform.json. Unknown keys are ignored (a newer writer may add some)."""
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{where}: expected a JSON object")
        version = raw.get("format_version", FORMAT_VERSION)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise CheckpointError(f"{where}: format_version {version!r} is newer than this code reads ({FORMAT_VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in names}
        if not isinstance(values.get("checkpoint_id"), str) or not values["checkpoint_id"]:
            raise CheckpointError(f"{where}: 'checkpoint_id' must be a non-empty string")
        fs = values.get("framestack", 1)
        if not isinstance(fs, int) or isinstance(fs, bool) or fs < 1:
            raise CheckpointError(f"{where}: 'framestack' must be an integer >= 1, got {fs!r}")
        md = values.get("module_dir", MODULE_DIR)
        if not isinstance(md, str) or md.startswith("/") or ".." in md.split("/"):
            raise CheckpointError(f"{where}: 'module_dir' must be a path inside the checkpoint, got {md!r}")
        if not isinstance(values.get("env_config", {}), Mapping):
            raise CheckpointError(f"{where}: 'env_config' must be an object")
        return cls(**values)


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def write_metadata(storage: Storage, meta: CheckpointMetadata, *rel: str) -> None:
    storage.write_json(meta.to_json(), *rel, METADATA_FILE)


def read_metadata(storage: Storage, *rel: str) -> CheckpointMetadata | None:
    """The checkpoint's metadata, or None when it has none."""
    if not storage.is_file(*rel, METADATA_FILE):
        return None
    where = redact(storage.uri(*rel, METADATA_FILE))
    try:
        raw = storage.read_json(*rel, METADATA_FILE)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{where}: unreadable metadata ({e})") from None
    return CheckpointMetadata.from_json(raw, where)


# --------------------------------------------------------------------------------------------- run state


@dataclass
class RunState:
    """state.json: written only after a checkpoint is complete, so a killed run resumes from a complete one."""

    latest_checkpoint: str | None = None  # run-relative
    iteration: int = 0
    env_steps: int = 0
    episode_return_mean: float | None = None
    # {checkpoint, iteration, env_steps, episode_return_mean, eval_return_mean, judged_by}; judged_by names the
    # figure best was chosen by: eval_return_mean (greedy evaluation) or episode_return_mean (training return; also
    # what a state.json without judged_by was judged by).
    best: dict[str, Any] | None = None
    periodic: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    return_history: list[list[float]] = field(default_factory=list)
    stop_reason: str | None = None
    # The latest greedy evaluation's return up to `iteration` (None: none yet, or a state.json from before).
    eval_return_mean: float | None = None

    @classmethod
    def from_json(cls, raw: Any, where: str) -> "RunState":
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{where}: expected a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


def read_state(storage: Storage) -> RunState | None:
    if not storage.is_file(STATE_FILE):
        return None
    where = redact(storage.uri(STATE_FILE))
    try:
        raw = storage.read_json(STATE_FILE)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{where}: unreadable run state ({e})") from None
    return RunState.from_json(raw, where)


def write_state(storage: Storage, state: RunState) -> None:
    storage.write_json(dataclasses.asdict(state), STATE_FILE)


class RunCheckpoints:
    """The writer side: periodic / best / final checkpoints of one run and the state.json pointer."""

    def __init__(self, storage: Storage, keep: int):
        self.storage = storage
        self.keep = max(keep, 1)
        self.state = read_state(storage) or RunState()

    @property
    def latest(self) -> str | None:
        return self.state.latest_checkpoint

    def is_complete(self, rel: str) -> bool:
        return self.storage.exists(rel, MODULE_DIR)

    def save(self, algo, name: str, meta: CheckpointMetadata) -> str:
        """`algo.save_to_path` into checkpoints/<name> plus its metadata; returns the run-relative path."""
        rel = checkpoint_rel(name)
        self.storage.delete_dir(rel)
        algo.save_to_path(self.storage.path(rel), filesystem=self.storage.fs)
        write_metadata(self.storage, meta, rel)
        return rel

    def mark_best(self, rel: str | None, meta: CheckpointMetadata, judged_by: str, algo=None) -> None:
        """Copy checkpoint `rel` to checkpoints/best with its own metadata, or save `algo` there when `rel` is None
        (an evaluated iteration without a periodic checkpoint); the state remembers it at commit. `judged_by`:
        the metadata figure best was chosen by (eval_return_mean or episode_return_mean)."""
        best = checkpoint_rel(BEST)
        if rel is None:
            self.save(algo, BEST, meta)
        else:
            self.storage.copy_dir((rel,), (best,))
            write_metadata(self.storage, meta, best)
        self.state.best = {"checkpoint": best, "iteration": meta.iteration, "env_steps": meta.env_steps,
                           "episode_return_mean": meta.episode_return_mean,
                           "eval_return_mean": meta.eval_return_mean, "judged_by": judged_by}

    def add_periodic(self, rel: str) -> None:
        """Remember periodic checkpoint `rel`, deleting the oldest beyond `keep`."""
        periodic = sorted(set(self.state.periodic) | {rel})
        for old in periodic[:-self.keep]:
            self.storage.delete_dir(old)
        self.state.periodic = periodic[-self.keep:]

    def commit(self, rel: str, *, iteration: int, env_steps: int, episode_return_mean: float | None,
               **extra: Any) -> None:
        """Point state.json at the complete checkpoint `rel`. The in-memory state moves only once the file is
        written, so after a failed write `latest` still names a checkpoint a rerun can resume from."""
        state = dataclasses.replace(self.state, latest_checkpoint=rel, iteration=iteration, env_steps=env_steps,
                                    episode_return_mean=episode_return_mean, **extra)
        write_state(self.storage, state)
        self.state = state


# --------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Checkpoint:
    """A resolved, complete checkpoint: where it is, where its RLModule is, its metadata (None if absent)."""

    storage: Storage  # rooted at the checkpoint
    module_rel: str  # "" when the checkpoint is a bare RLModule directory
    metadata: CheckpointMetadata | None

    @property
    def location(self) -> str:
        """The checkpoint as users name it (local path or URI), secrets redacted."""
        return redact(self.storage.uri())

    @property
    def module_location(self) -> str:
        return redact(self.storage.uri(self.module_rel) if self.module_rel else self.storage.uri())

    @property
    def checkpoint_id(self) -> str:
        """The metadata's id, else one derived from the location and the module files' mtime (stable per save)."""
        if self.metadata is not None:
            return self.metadata.checkpoint_id
        stamp = self.storage.latest_mtime_ns(*self._module_parts())
        digest = hashlib.sha1(f"{self.storage.uri()}:{stamp}".encode()).hexdigest()[:10]
        name = self.storage.root.rstrip("/").rsplit("/", 1)[-1]
        return f"{name}-{digest}"

    def _module_parts(self) -> tuple[str, ...]:
        return (self.module_rel,) if self.module_rel else ()

    def local_module_dir(self, cache_dir: str | os.PathLike | None = None) -> tuple[Path, Path | None]:
        """-> (a local directory holding the RLModule, the downloaded copy to delete later or None).

        Local checkpoints are read in place. Remote ones: only the RLModule directory is downloaded (not the
        learner's optimizer state or the env runners'), into a fresh directory under `cache_dir`."""
        if self.storage.local:
            return Path(self.storage.path(*self._module_parts())), None
        root = Path(cache_dir or tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        dest = Path(tempfile.mkdtemp(prefix=f"{self.checkpoint_id[:60]}-", dir=root))
        try:
            self.storage.download_dir(str(dest), *self._module_parts())
        except Exception as e:  # network, credentials, a checkpoint deleted meanwhile
            shutil.rmtree(dest, ignore_errors=True)
            raise CheckpointError(f"cannot download {self.module_location!r}: {type(e).__name__}: {e}") from None
        return dest, dest


def resolve(location: str, select: str = LATEST, base_dir: str | None = None) -> Checkpoint:
    """A checkpoint directory, a bare RLModule directory, or a run's output directory (then `select`: latest,
    best or final) -> the complete checkpoint there. Raises CheckpointError naming what is wrong."""
    if select not in SELECTORS:
        raise CheckpointError(f"checkpoint selector {select!r} is not one of {SELECTORS}")
    storage = Storage.open(location, create=False, base_dir=base_dir)
    shown = redact(storage.uri())
    info = storage.info()
    if info.type.name == "NotFound":
        raise CheckpointError(
            f"checkpoint directory {shown!r} does not exist (train one with `make train`, or point at an RLlib "
            f"checkpoint, a run's output_dir, or a URI such as s3://bucket/run/checkpoints/final)"
        )
    if info.type.name != "Directory":
        raise CheckpointError(f"checkpoint {shown!r} is not a directory")
    if not storage.exists(METADATA_FILE) and not storage.exists(_ALGO_MARKER) and storage.is_file(STATE_FILE):
        state = read_state(storage)
        rel = state.latest_checkpoint if select == LATEST else checkpoint_rel(select)
        if not rel:
            raise CheckpointError(f"run {shown!r} has no complete checkpoint yet")
        return resolve(storage.uri(rel), LATEST)
    meta = read_metadata(storage)
    if storage.is_file(_MODULE_MARKER) and not storage.exists(_ALGO_MARKER):
        return Checkpoint(storage, "", meta)
    module_rel = (meta.module_dir if meta else MODULE_DIR).strip("/")
    module_rel = "" if module_rel in ("", ".") else module_rel
    if not storage.is_file(*((module_rel,) if module_rel else ()), _MODULE_MARKER):
        raise CheckpointError(
            f"checkpoint {shown!r} holds no RLModule at {redact(storage.uri(module_rel))!r} (expected an RLlib "
            f"Algorithm checkpoint saved with algo.save_to_path, or an RLModule directory; a partial upload?)"
        )
    return Checkpoint(storage, module_rel, meta)
