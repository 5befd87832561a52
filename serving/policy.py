"""A policy loaded from a checkpoint: where it came from, its RLModule, input validation and greedy actions.

Nothing here knows about HTTP or Ray Serve, so the same object backs the Serve replica, the export tool, the
benchmark's in-process floor and the tests' reference actions. The checkpoint layout and metadata are the
trainer's contract (`rl_checkpoint`); a checkpoint may be a local path or any URI the trainer writes (s3://,
gs://, ...), which is downloaded (the RLModule only) into a local cache directory first.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rl_checkpoint import (METADATA_FILE, Checkpoint, CheckpointError, CheckpointMetadata, latest_eval, read_eval_records,
                           redact, resolve)
from rl_checkpoint.registry import RegistryError, is_registry_ref, parse_ref, resolve_ref
from serving.codec import space_to_json
from serving.config import ServingLimits
from serving.inference import GreedyActions, Inference
from serving.sessions import FrameStacks
from serving.validation import ObservationValidator, frame_input, frame_shape_of

logger = logging.getLogger("serving")

METADATA_SOURCES = (METADATA_FILE, "module")  # metadata from the checkpoint's record, or the module's spaces only


def resolve_source(location: str | os.PathLike) -> tuple[Checkpoint, dict[str, Any] | None]:
    """-> (the checkpoint at `location`, what the registry says of it or None).

    `location` is a checkpoint (relative paths resolve against $RL_PLATFORM_ROOT, else the cwd) or a registry
    reference `registry:<root>/<name>@<alias|version>`, resolved to the version it points at *now*: the server
    resolves it at load and at every reconfigure, so `rl-policy promote` + a reload moves the policy."""
    loc = str(location)
    if not is_registry_ref(loc):
        return resolve(loc, base_dir=os.environ.get("RL_PLATFORM_ROOT") or os.getcwd()), None
    try:
        _, name, ref = parse_ref(loc)
        version, ckpt = resolve_ref(loc)
    except RegistryError as e:
        raise CheckpointError(str(e)) from None
    alias = None if str(ref).isdigit() else str(ref)
    return ckpt, {"ref": redact(loc), "name": name, "version": int(version.version), "alias": alias,
                  "aliases": sorted(version.aliases)}


def resolve_checkpoint(location: str | os.PathLike) -> Checkpoint:
    """The checkpoint at `location` (a path, URI or registry reference, see `resolve_source`)."""
    return resolve_source(location)[0]


def eval_summary(ckpt: Checkpoint) -> dict[str, Any] | None:
    """The newest evaluation record of this checkpoint (rl-eval), summarised; None when it was never evaluated.
    An unreadable record is reported, not fatal: serving does not depend on it."""
    try:
        rec = latest_eval(read_eval_records(ckpt.storage), ckpt.checkpoint_id)
    except CheckpointError as e:
        logger.warning("checkpoint %s: %s", ckpt.location, e)
        return None
    return rec.summary() if rec is not None else None


@dataclass
class PolicySource:
    """Where a loaded policy came from."""

    location: str  # the checkpoint as users name it (secrets redacted)
    checkpoint_id: str
    metadata: CheckpointMetadata | None
    local_copy: Path | None = None  # downloaded RLModule (remote checkpoints); deleted by `release`
    registry: dict[str, Any] | None = None  # {ref, name, version, alias, aliases} when loaded through the registry
    evaluation: dict[str, Any] | None = None  # the newest evaluation record's summary (rl-eval), if any

    @property
    def metadata_source(self) -> str:
        return METADATA_SOURCES[0] if self.metadata is not None else METADATA_SOURCES[1]


def _load_module(ckpt: Checkpoint, cache_dir: str | os.PathLike | None):
    """-> (RLModule, local copy or None). A corrupt or foreign checkpoint: say which, without a traceback wall."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    module_dir, copy = ckpt.local_module_dir(cache_dir)
    try:
        module = RLModule.from_checkpoint(str(module_dir))
    except Exception as e:
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)
        raise CheckpointError(f"cannot load RLModule from {ckpt.module_location!r}: {type(e).__name__}: {e}") from e
    return module, copy


def _check_spaces(where: str, obs_space: Any, act_space: Any, framestack: int) -> None:
    from gymnasium import spaces

    if not isinstance(obs_space, spaces.Box):
        raise CheckpointError(f"{where}: observation space {obs_space} is not a Box; only Box observations are served")
    if not isinstance(act_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)):
        raise CheckpointError(f"{where}: action space {act_space} is not Discrete, MultiDiscrete or Box")
    if framestack > 1 and (len(obs_space.shape) < 1 or obs_space.shape[-1] % framestack):
        raise CheckpointError(f"{where}: framestack={framestack} does not divide the module's observation shape {obs_space.shape}")


@dataclass
class LoadedPolicy:
    name: str
    source: PolicySource
    module: Any
    observation_space: Any
    action_space: Any
    framestack: int
    validator: ObservationValidator
    inference: Inference
    greedy: GreedyActions
    sessions: FrameStacks | None
    limits: ServingLimits = field(default_factory=ServingLimits)
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0

    @classmethod
    def load(cls, name: str, checkpoint: str | os.PathLike, limits: ServingLimits | None = None,
             cache_dir: str | os.PathLike | None = None) -> "LoadedPolicy":
        """Raises CheckpointError (naming the checkpoint) for anything that cannot be served."""
        import torch

        t0 = time.perf_counter()
        limits = limits or ServingLimits()
        ckpt, registry = resolve_source(checkpoint)
        meta = ckpt.metadata
        module, copy = _load_module(ckpt, cache_dir)
        try:
            if isinstance(module, torch.nn.Module):
                module.eval()
            framestack = meta.framestack if meta else 1
            obs_space, act_space = module.observation_space, module.action_space
            _check_spaces(ckpt.location, obs_space, act_space, framestack)
            source = PolicySource(ckpt.location, ckpt.checkpoint_id, meta, copy, registry, eval_summary(ckpt))
            if meta is None:
                logger.warning("policy %r: %s has no %s; using the module's own spaces and derived checkpoint id %r",
                               name, ckpt.location, METADATA_FILE, source.checkpoint_id)
            frame_shape = frame_shape_of(tuple(obs_space.shape), framestack)
            atari_dim = frame_input(meta.env, meta.env_config, frame_shape) if meta and frame_shape else None
            validator = ObservationValidator(name, obs_space, framestack, limits, atari_dim)
            sessions = FrameStacks(framestack, validator.frame_shape, limits.max_sessions, limits.session_ttl_s) \
                if validator.frame_shape is not None else None
            pol = cls(name=name, source=source, module=module, observation_space=obs_space, action_space=act_space,
                      framestack=framestack, validator=validator, inference=Inference(module, obs_space, name),
                      greedy=GreedyActions(act_space), sessions=sessions, limits=limits)
        except BaseException:
            if copy is not None:
                shutil.rmtree(copy, ignore_errors=True)
            raise
        pol.load_seconds = time.perf_counter() - t0
        return pol

    def release(self) -> None:
        """Delete the downloaded copy of a remote checkpoint (the module stays usable: it is in memory)."""
        if self.source.local_copy is not None:
            shutil.rmtree(self.source.local_copy, ignore_errors=True)
            self.source.local_copy = None

    def carry_sessions_from(self, old: "LoadedPolicy") -> None:
        """An env-side frame stack survives a weights update when the frames are alike."""
        if old.sessions is not None and self.sessions is not None and old.framestack == self.framestack \
                and old.validator.frame_shape == self.validator.frame_shape:
            old.sessions.max_sessions = self.limits.max_sessions
            old.sessions.ttl_s = self.limits.session_ttl_s
            self.sessions = old.sessions

    # ------------------------------------------------------------------ description

    @property
    def checkpoint(self) -> str:
        return self.source.location

    @property
    def checkpoint_id(self) -> str:
        return self.source.checkpoint_id

    @property
    def env(self) -> str | None:
        return self.source.metadata.env if self.source.metadata else None

    @property
    def frame_shape(self) -> tuple[int, ...] | None:
        return self.validator.frame_shape

    def info(self) -> dict[str, Any]:
        m = self.source.metadata
        out: dict[str, Any] = {
            "name": self.name,
            "checkpoint_id": self.checkpoint_id,
            "version": self.checkpoint_id,
            "checkpoint": self.checkpoint,
            "metadata_source": self.source.metadata_source,
            "env": self.env,
            "algo": m.algo if m else None,
            "experiment": m.experiment if m else None,
            "iteration": m.iteration if m else None,
            "env_steps": m.env_steps if m else None,
            "created": m.created if m else None,
            "loaded_at": self.loaded_at,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
            "framestack": self.framestack,
            "registry": self.source.registry,
            "evaluation": self.source.evaluation,
        }
        if self.frame_shape is not None:
            out["frame"] = {
                "shape": list(self.frame_shape),
                "raw_rgb_accepted": self.validator.atari_dim is not None,
                "sessions": len(self.sessions) if self.sessions else 0,
            }
        return out

    # ------------------------------------------------------------------ validation and inference

    def observation(self, value: Any) -> np.ndarray:
        return self.validator.observation(value)

    def observations(self, value: Any) -> np.ndarray:
        return self.validator.observations(value)

    def frame(self, value: Any) -> np.ndarray:
        return self.validator.frame(value)

    def act(self, batch: np.ndarray) -> list[Any]:
        """(N, *obs_shape) validated observations -> N greedy actions (JSON-ready)."""
        return self.greedy(self.inference.logits(batch))
