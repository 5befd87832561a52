"""A policy loaded from a checkpoint: its RLModule, its spaces, input validation and greedy actions.

Nothing here knows about HTTP or Ray Serve, so the same object backs the Serve replica, the export tool,
the benchmark's in-process floor and the tests' reference actions.

Checkpoint layout (the trainer's contract): an RLlib Algorithm checkpoint whose RLModule lives at
`<ckpt>/learner_group/learner/rl_module/default_policy/`, plus `<ckpt>/rl_platform.json` describing the env,
frame stacking and a stable `checkpoint_id`. The metadata file is optional: without it the module's own
spaces are used and the id is derived from the path (logged as a warning). A bare RLModule directory is
accepted too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from serving.errors import ApiError, CheckpointError, unprocessable

logger = logging.getLogger("serving")

METADATA_FILE = "rl_platform.json"
DEFAULT_MODULE_DIR = "learner_group/learner/rl_module/default_policy"
# dtypes a client may name in a base64-encoded array.
_B64_DTYPES = {"uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}


# --------------------------------------------------------------------------------------------- checkpoint


def _is_module_dir(p: Path) -> bool:
    return (p / "class_and_ctor_args.pkl").is_file() and not (p / "learner_group").exists()


def resolve_checkpoint(checkpoint: str | os.PathLike) -> tuple[Path, Path, dict[str, Any] | None]:
    """-> (checkpoint root, RLModule dir, metadata or None). Raises CheckpointError with a readable message."""
    root = Path(checkpoint).expanduser()
    if not root.is_absolute():
        root = (Path(os.environ.get("RL_PLATFORM_ROOT", os.getcwd())) / root).resolve()
    if not root.exists():
        raise CheckpointError(
            f"checkpoint directory {str(root)!r} does not exist (train one with `make train`, or point "
            f"user_config.policies.<name>.checkpoint at an RLlib checkpoint)"
        )
    if not root.is_dir():
        raise CheckpointError(f"checkpoint {str(root)!r} is not a directory")
    meta: dict[str, Any] | None = None
    meta_path = root / METADATA_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{meta_path}: unreadable metadata ({e})") from None
        if not isinstance(meta, dict):
            raise CheckpointError(f"{meta_path}: expected a JSON object")
    if _is_module_dir(root):
        return root, root, meta
    module_dir = root / (meta or {}).get("module_dir", DEFAULT_MODULE_DIR)
    if not (module_dir / "class_and_ctor_args.pkl").is_file():
        raise CheckpointError(
            f"checkpoint {str(root)!r} holds no RLModule at {str(module_dir)!r} (expected an RLlib Algorithm "
            f"checkpoint saved with algo.save_to_path, or an RLModule directory)"
        )
    return root, module_dir, meta


def derived_checkpoint_id(root: Path, module_dir: Path) -> str:
    """A stable id when rl_platform.json is missing: path plus the module state's mtime."""
    stamp = max((f.stat().st_mtime_ns for f in module_dir.iterdir() if f.is_file()), default=0)
    digest = hashlib.sha1(f"{root.resolve()}:{stamp}".encode()).hexdigest()[:10]
    return f"{root.name}-{digest}"


# --------------------------------------------------------------------------------------------- spaces


def _compact_bound(a: np.ndarray) -> Any:
    """Box bounds for JSON: a scalar when uniform, null for +-inf (JSON has no infinity)."""
    arr = np.asarray(a)
    flat = arr.astype(np.float64).ravel()
    f32 = arr.dtype == np.float32

    def one(v: float) -> Any:
        if not math.isfinite(v):
            return None
        if float(v).is_integer():
            return int(v)
        # float32 bounds print as their shortest float32 repr (4.8, not 4.800000190734863).
        return float(np.format_float_positional(np.float32(v), unique=True)) if f32 else float(v)

    if flat.size and np.all(flat == flat[0]):
        return one(float(flat[0]))
    return [one(float(v)) for v in flat]


def space_to_json(space: Any) -> dict[str, Any]:
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _compact_bound(space.low),
            "high": _compact_bound(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": [int(n) for n in np.asarray(space.nvec).ravel()]}
    return {"type": type(space).__name__, "repr": repr(space)}


# --------------------------------------------------------------------------------------------- decoding


def decode_array(value: Any, what: str) -> np.ndarray:
    """JSON value -> numpy array, rejecting non-numeric and ragged input with a 422 naming the problem.

    Accepts nested lists of numbers, or {"b64": <base64>, "dtype": ..., "shape": [...]} for compact binary.
    """
    if isinstance(value, dict):
        return _decode_b64(value, what)
    if isinstance(value, (str, bool)) or value is None:
        raise unprocessable("bad_dtype", f"{what} must be an array of numbers, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        raise unprocessable("ragged_array", f"{what} is a ragged nested list (rows of different lengths)") from None
    kind = arr.dtype.kind
    if kind in "iuf":
        return arr
    if kind == "b":
        raise unprocessable("bad_dtype", f"{what} must hold numbers, not booleans")
    if kind == "O":
        raise unprocessable("ragged_array", f"{what} is ragged or mixes numbers with other values")
    raise unprocessable("bad_dtype", f"{what} must hold numbers, got {arr.dtype.kind!r}-kind values (strings?)")


def _decode_b64(value: Mapping[str, Any], what: str) -> np.ndarray:
    unknown = set(value) - {"b64", "dtype", "shape"}
    if unknown or "b64" not in value:
        raise unprocessable(
            "bad_encoding", f"{what}: an encoded array is {{'b64', 'dtype', 'shape'}}, got keys {sorted(value)}"
        )
    dtype = value.get("dtype", "float32")
    if dtype not in _B64_DTYPES:
        raise unprocessable("bad_dtype", f"{what}: dtype {dtype!r} not one of {sorted(_B64_DTYPES)}")
    shape = value.get("shape")
    if not (isinstance(shape, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise unprocessable("bad_shape", f"{what}: 'shape' must be a list of non-negative integers")
    if not isinstance(value["b64"], str):
        raise unprocessable("bad_encoding", f"{what}: 'b64' must be a base64 string")
    try:
        raw = base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise unprocessable("bad_encoding", f"{what}: 'b64' is not valid base64") from None
    dt = np.dtype(dtype)
    expected = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if len(raw) != expected:
        raise unprocessable(
            "bad_shape", f"{what}: {len(raw)} bytes do not fill shape {shape} of {dtype} ({expected} bytes)"
        )
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


# --------------------------------------------------------------------------------------------- sessions


class FrameStacks:
    """Per-session frame stacks for frame-stacked policies (Pong), bounded by count and idle time.

    Mirrors RLlib's FrameStackingEnvToModule: the stack of a new episode is zero-filled, then each frame is
    appended along the last axis, oldest first. State is replica-local (see README: sessions need one replica
    or session affinity; stateless clients send the stacked observation instead).
    """

    def __init__(self, num_frames: int, frame_shape: tuple[int, ...], max_sessions: int, ttl_s: float):
        self.num_frames = num_frames
        self.frame_shape = frame_shape
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._stacks: OrderedDict[str, tuple[deque, float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._stacks)

    def push(self, session_id: str, frame: np.ndarray, reset: bool) -> tuple[np.ndarray, bool, int]:
        """-> (stacked observation, whether the session started now, frames received in this episode)."""
        now = time.monotonic()
        self._expire(now)
        entry = self._stacks.pop(session_id, None)
        new = entry is None or reset
        if new:
            stack: deque = deque([np.zeros(self.frame_shape, np.float32)] * self.num_frames, maxlen=self.num_frames)
            count = 0
        else:
            stack, _, count = entry
        stack.append(frame)
        count += 1
        self._stacks[session_id] = (stack, now, count)
        while len(self._stacks) > self.max_sessions:
            self._stacks.popitem(last=False)
        return np.concatenate(list(stack), axis=-1), new, count

    def end(self, session_id: str) -> bool:
        return self._stacks.pop(session_id, None) is not None

    def _expire(self, now: float) -> None:
        while self._stacks:
            sid, (_, seen, _) = next(iter(self._stacks.items()))
            if now - seen <= self.ttl_s:
                break
            del self._stacks[sid]


# --------------------------------------------------------------------------------------------- policy


@dataclass
class ServingLimits:
    max_batch_items: int = 1024
    check_bounds: bool = True
    max_sessions: int = 1024
    session_ttl_s: float = 600.0


@dataclass
class LoadedPolicy:
    name: str
    checkpoint: str
    checkpoint_id: str
    metadata: dict[str, Any]
    metadata_source: str
    module: Any
    observation_space: Any
    action_space: Any
    framestack: int
    env: str | None
    limits: ServingLimits = field(default_factory=ServingLimits)
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, name: str, checkpoint: str | os.PathLike, limits: ServingLimits | None = None) -> "LoadedPolicy":
        from gymnasium import spaces

        t0 = time.perf_counter()
        root, module_dir, meta = resolve_checkpoint(checkpoint)
        import torch
        from ray.rllib.core.rl_module.rl_module import RLModule

        try:
            module = RLModule.from_checkpoint(str(module_dir))
        except Exception as e:  # a corrupt or foreign checkpoint: say which, without a traceback wall
            raise CheckpointError(f"cannot load RLModule from {str(module_dir)!r}: {type(e).__name__}: {e}") from e
        if isinstance(module, torch.nn.Module):
            module.eval()
        obs_space, act_space = module.observation_space, module.action_space
        if not isinstance(obs_space, spaces.Box):
            raise CheckpointError(f"{root}: observation space {obs_space} is not a Box; only Box observations are served")
        if not isinstance(act_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)):
            raise CheckpointError(f"{root}: action space {act_space} is not Discrete, MultiDiscrete or Box")
        if meta is None:
            source = "module"
            ckpt_id = derived_checkpoint_id(root, module_dir)
            framestack = 1
            env = None
            logger.warning(
                "policy %r: %s has no %s; using the module's own spaces and derived checkpoint id %r",
                name, root, METADATA_FILE, ckpt_id,
            )
            meta = {}
        else:
            source = METADATA_FILE
            ckpt_id = str(meta.get("checkpoint_id") or derived_checkpoint_id(root, module_dir))
            framestack = int(meta.get("framestack", 1) or 1)
            env = meta.get("env")
        if framestack > 1 and (len(obs_space.shape) < 1 or obs_space.shape[-1] % framestack):
            raise CheckpointError(
                f"{root}: framestack={framestack} does not divide the module's observation shape {obs_space.shape}"
            )
        pol = cls(
            name=name,
            checkpoint=str(root),
            checkpoint_id=ckpt_id,
            metadata=meta,
            metadata_source=source,
            module=module,
            observation_space=obs_space,
            action_space=act_space,
            framestack=framestack,
            env=env,
            limits=limits or ServingLimits(),
        )
        pol._prepare()
        pol._prepare_inference()
        pol.load_seconds = time.perf_counter() - t0
        return pol

    def _prepare_inference(self) -> None:
        """Pick the fastest exact path to the action logits.

        `forward_inference` re-runs `eval()` over every submodule on each call, and the learner's module also
        carries the value-function encoder, which inference never needs. Env runners solve this with an
        inference-only twin of the module; so do we (built from the module's own ctor args and
        `get_state(inference_only=True)`), verified to give identical logits on sampled observations, else
        the full module is used. Together ~3x less time per forward for the default PPO MLP.
        """
        import torch

        m = self.module
        self.inference_module = m
        self._forward = m.forward_inference
        if not isinstance(m, torch.nn.Module) or not hasattr(m, "_forward_inference"):
            return
        m.eval()  # once; forward_inference would do it per call
        self._forward = m._forward_inference
        if getattr(m, "inference_only", False):
            return
        try:
            args, kwargs = m.get_ctor_args_and_kwargs()
            twin = type(m)(*args, **{**kwargs, "inference_only": True})
            twin.set_state(m.get_state(inference_only=True))
            twin.eval()
            rng = np.random.default_rng(0)
            space = self.observation_space
            low = np.nan_to_num(np.broadcast_to(space.low, space.shape).astype(np.float64), neginf=-3.0, posinf=3.0)
            high = np.nan_to_num(np.broadcast_to(space.high, space.shape).astype(np.float64), neginf=-3.0, posinf=3.0)
            probe = torch.from_numpy(rng.uniform(low, high, size=(16,) + space.shape).astype(space.dtype))
            with torch.inference_mode():
                ref = m.forward_inference({"obs": probe})["action_dist_inputs"]
                got = twin._forward_inference({"obs": probe})["action_dist_inputs"]
            if ref.shape == got.shape and torch.allclose(ref, got, rtol=0, atol=1e-6):
                self.inference_module = twin
                self._forward = twin._forward_inference
            else:
                logger.warning("policy %r: inference-only module disagrees with the full module; using the full one", self.name)
        except Exception as e:  # any module type without a usable inference-only form
            logger.info("policy %r: no inference-only twin (%s: %s); using the full module", self.name, type(e).__name__, e)

    def _prepare(self) -> None:
        from gymnasium import spaces

        space = self.observation_space
        self._obs_shape = tuple(space.shape)
        self._obs_dtype = np.dtype(space.dtype)
        low = np.broadcast_to(np.asarray(space.low, np.float64), self._obs_shape)
        high = np.broadcast_to(np.asarray(space.high, np.float64), self._obs_shape)
        self._bounded = bool(np.isfinite(low).any() or np.isfinite(high).any())
        self._low, self._high = low, high
        if self.framestack > 1:
            self.frame_shape = self._obs_shape[:-1] + (self._obs_shape[-1] // self.framestack,)
            self.sessions: FrameStacks | None = FrameStacks(
                self.framestack, self.frame_shape, self.limits.max_sessions, self.limits.session_ttl_s
            )
            cfg = dict(self.metadata.get("env_config") or {})
            if self.env:
                try:
                    import rl_envs.registry as reg

                    cfg = reg.merged_config(self.env, cfg)
                except KeyError:
                    pass
            # Raw RGB frames are accepted for Atari envs: the server applies the trainer's preprocessing.
            self._atari_dim = int(cfg.get("dim", self.frame_shape[0])) if "game" in cfg else None
        else:
            self.frame_shape = None
            self.sessions = None
            self._atari_dim = None
        act = self.action_space
        if isinstance(act, spaces.Discrete):
            self._act_kind, self._act_start = "discrete", int(act.start)
        elif isinstance(act, spaces.MultiDiscrete):
            self._act_kind = "multidiscrete"
            self._nvec = [int(n) for n in np.asarray(act.nvec).ravel()]
            self._splits = np.cumsum(self._nvec)[:-1]
        else:
            self._act_kind = "box"
            self._act_low = np.asarray(act.low, np.float32).ravel()
            self._act_high = np.asarray(act.high, np.float32).ravel()

    # ------------------------------------------------------------------ description

    def info(self) -> dict[str, Any]:
        m = self.metadata
        out: dict[str, Any] = {
            "name": self.name,
            "checkpoint_id": self.checkpoint_id,
            "version": self.checkpoint_id,
            "checkpoint": self.checkpoint,
            "metadata_source": self.metadata_source,
            "env": self.env,
            "algo": m.get("algo"),
            "experiment": m.get("experiment"),
            "iteration": m.get("iteration"),
            "env_steps": m.get("env_steps"),
            "created": m.get("created"),
            "loaded_at": self.loaded_at,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
            "framestack": self.framestack,
        }
        if self.framestack > 1:
            out["frame"] = {
                "shape": list(self.frame_shape),
                "raw_rgb_accepted": self._atari_dim is not None,
                "sessions": len(self.sessions) if self.sessions else 0,
            }
        return out

    # ------------------------------------------------------------------ validation

    def _check_values(self, arr: np.ndarray, what: str, low: np.ndarray | None = None, high: np.ndarray | None = None) -> np.ndarray:
        """Cast to the space's dtype; reject non-finite, non-integral (integer spaces) and out-of-bounds values."""
        low = self._low if low is None else low
        high = self._high if high is None else high
        if self._obs_dtype.kind == "f":
            out = arr.astype(self._obs_dtype, copy=False)
            if not np.isfinite(out).all():
                bad = np.argwhere(~np.isfinite(out))[0].tolist()
                raise unprocessable(
                    "non_finite", f"{what} holds a non-finite value (NaN/inf, or too large for {self._obs_dtype}) at index {bad}"
                )
        else:
            a64 = arr.astype(np.float64, copy=False)
            if not np.isfinite(a64).all() or not np.all(a64 == np.round(a64)):
                raise unprocessable("bad_dtype", f"{what} must hold integers for a {self._obs_dtype} space")
            out = arr
        if self.limits.check_bounds and self._bounded:
            ok = (out >= low) & (out <= high)
            if not ok.all():
                idx = tuple(np.argwhere(~ok)[0].tolist())
                tail = idx[-low.ndim:] if low.ndim else ()
                raise unprocessable(
                    "out_of_bounds",
                    f"{what} value {float(out[idx]):g} at index {list(idx)} is outside the observation space "
                    f"[{low[tail]:g}, {high[tail]:g}]",
                )
        if out.dtype != self._obs_dtype:
            out = out.astype(self._obs_dtype)
        return out

    def observation(self, value: Any) -> np.ndarray:
        """One observation (the module's input, frames already stacked) -> validated array of the space's shape."""
        arr = decode_array(value, "observation")
        if arr.shape != self._obs_shape:
            raise unprocessable(
                "bad_shape",
                f"observation has shape {_fmt_shape(arr.shape)}, policy {self.name!r} expects "
                f"{_fmt_shape(self._obs_shape)}"
                + (f" (or send one frame of shape {_fmt_shape(self.frame_shape)} with a session_id)" if self.frame_shape else ""),
            )
        return self._check_values(arr, "observation")

    def observations(self, value: Any) -> np.ndarray:
        """A batch -> validated (N, *obs_shape) array."""
        if isinstance(value, list) and not value:
            raise unprocessable("empty_batch", "observations is an empty list")
        if isinstance(value, list) and len(value) > self.limits.max_batch_items:
            raise ApiError(
                413, "batch_too_large", f"batch of {len(value)} observations exceeds the limit of {self.limits.max_batch_items}"
            )
        arr = decode_array(value, "observations")
        if arr.ndim != len(self._obs_shape) + 1 or arr.shape[1:] != self._obs_shape:
            raise unprocessable(
                "bad_shape",
                f"observations has shape {_fmt_shape(arr.shape)}, policy {self.name!r} expects "
                f"(N, {', '.join(str(s) for s in self._obs_shape)})",
            )
        if arr.shape[0] == 0:
            raise unprocessable("empty_batch", "observations holds no observation")
        if arr.shape[0] > self.limits.max_batch_items:
            raise ApiError(
                413, "batch_too_large", f"batch of {arr.shape[0]} observations exceeds the limit of {self.limits.max_batch_items}"
            )
        return self._check_values(arr, "observations")

    def frame(self, value: Any) -> np.ndarray:
        """One frame for a session: preprocessed (frame_shape, or without the channel axis) or, for Atari, raw RGB."""
        if self.frame_shape is None:
            raise unprocessable("not_frame_stacked", f"policy {self.name!r} does not stack frames; send 'observation'")
        arr = decode_array(value, "frame")
        fs = self.frame_shape
        if self._atari_dim is not None and arr.ndim == 3 and arr.shape[-1] == 3 and arr.shape != fs:
            a64 = arr.astype(np.float64, copy=False)
            if not np.isfinite(a64).all() or (a64 < 0).any() or (a64 > 255).any() or not np.all(a64 == np.round(a64)):
                raise unprocessable("bad_dtype", "a raw RGB frame must hold integers in [0, 255]")
            from rl_envs.atari import preprocess_frame

            return preprocess_frame(arr.astype(np.uint8), dim=self._atari_dim)
        if arr.shape == fs[:-1] and fs[-1] == 1:
            arr = arr[..., None]
        if arr.shape != fs:
            expected = f"{_fmt_shape(fs)}" + (" or a raw RGB frame (H, W, 3)" if self._atari_dim else "")
            raise unprocessable("bad_shape", f"frame has shape {_fmt_shape(arr.shape)}, policy {self.name!r} expects {expected}")
        # The stacked space's bounds repeat per frame; the first frame's slice bounds one frame.
        return self._check_values(arr, "frame", self._low[..., : fs[-1]], self._high[..., : fs[-1]])

    # ------------------------------------------------------------------ inference

    def logits(self, batch: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self._forward({"obs": torch.from_numpy(np.ascontiguousarray(batch))})
        return out["action_dist_inputs"].numpy()

    def actions_from_logits(self, logits: np.ndarray) -> list[Any]:
        if self._act_kind == "discrete":
            return (logits.argmax(axis=-1) + self._act_start).tolist()
        if self._act_kind == "multidiscrete":
            parts = np.split(logits, self._splits, axis=-1)
            return np.stack([p.argmax(axis=-1) for p in parts], axis=-1).tolist()
        # Box actions: the distribution inputs are [mean, log_std]; greedy = mean, clipped to the space.
        mean = logits[:, : logits.shape[-1] // 2]
        return np.clip(mean, self._act_low, self._act_high).tolist()

    def act(self, batch: np.ndarray) -> list[Any]:
        """(N, *obs_shape) validated observations -> N greedy actions (JSON-ready)."""
        return self.actions_from_logits(self.logits(batch))
