"""Client input -> arrays the policy's RLModule accepts, or a 4xx naming what is wrong (shape, dtype, NaN, bounds)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from serving.codec import decode_array, fmt_shape
from serving.config import ServingLimits
from serving.errors import ApiError, unprocessable


def frame_shape_of(obs_shape: tuple[int, ...], framestack: int) -> tuple[int, ...] | None:
    """One frame of a frame-stacked observation (frames stacked along the last axis), None if not stacked."""
    return tuple(obs_shape[:-1]) + (obs_shape[-1] // framestack,) if framestack > 1 else None


def frame_input(env: str | None, env_config: Mapping[str, Any], frame_shape: tuple[int, ...]) -> int | None:
    """The Atari resize dim when raw RGB frames can be preprocessed server-side like the trainer's env, else None."""
    cfg = dict(env_config or {})
    if env:
        try:
            import rl_envs.registry as reg

            cfg = reg.merged_config(env, cfg)
        except KeyError:  # an env this code base does not know: accept preprocessed frames only
            pass
    return int(cfg.get("dim", frame_shape[0])) if "game" in cfg else None


class ObservationValidator:
    """Checks observations (and single frames of frame-stacked policies) against one observation space."""

    def __init__(self, policy_name: str, space: Any, framestack: int, limits: ServingLimits,
                 atari_dim: int | None = None):
        self.policy_name = policy_name
        self.limits = limits
        self.obs_shape = tuple(space.shape)
        self.obs_dtype = np.dtype(space.dtype)
        self.low = np.broadcast_to(np.asarray(space.low, np.float64), self.obs_shape)
        self.high = np.broadcast_to(np.asarray(space.high, np.float64), self.obs_shape)
        self.bounded = bool(np.isfinite(self.low).any() or np.isfinite(self.high).any())
        self.frame_shape = frame_shape_of(self.obs_shape, framestack)
        self.atari_dim = atari_dim if self.frame_shape else None

    def _check_values(self, arr: np.ndarray, what: str, low: np.ndarray | None = None,
                      high: np.ndarray | None = None) -> np.ndarray:
        """Cast to the space's dtype; reject non-finite, non-integral (integer spaces) and out-of-bounds values."""
        low = self.low if low is None else low
        high = self.high if high is None else high
        if self.obs_dtype.kind == "f":
            out = arr.astype(self.obs_dtype, copy=False)
            if not np.isfinite(out).all():
                bad = np.argwhere(~np.isfinite(out))[0].tolist()
                raise unprocessable(
                    "non_finite", f"{what} holds a non-finite value (NaN/inf, or too large for {self.obs_dtype}) at index {bad}"
                )
        else:
            a64 = arr.astype(np.float64, copy=False)
            if not np.isfinite(a64).all() or not np.all(a64 == np.round(a64)):
                raise unprocessable("bad_dtype", f"{what} must hold integers for a {self.obs_dtype} space")
            out = arr
        if self.limits.check_bounds and self.bounded:
            ok = (out >= low) & (out <= high)
            if not ok.all():
                idx = tuple(np.argwhere(~ok)[0].tolist())
                tail = idx[-low.ndim:] if low.ndim else ()
                raise unprocessable(
                    "out_of_bounds",
                    f"{what} value {float(out[idx]):g} at index {list(idx)} is outside the observation space "
                    f"[{low[tail]:g}, {high[tail]:g}]",
                )
        if out.dtype != self.obs_dtype:
            out = out.astype(self.obs_dtype)
        return out

    def observation(self, value: Any) -> np.ndarray:
        """One observation (the module's input, frames already stacked) -> validated array of the space's shape."""
        arr = decode_array(value, "observation")
        if arr.shape != self.obs_shape:
            raise unprocessable(
                "bad_shape",
                f"observation has shape {fmt_shape(arr.shape)}, policy {self.policy_name!r} expects "
                f"{fmt_shape(self.obs_shape)}"
                + (f" (or send one frame of shape {fmt_shape(self.frame_shape)} with a session_id)" if self.frame_shape else ""),
            )
        return self._check_values(arr, "observation")

    def _too_large(self, n: int) -> ApiError:
        return ApiError(413, "batch_too_large", f"batch of {n} observations exceeds the limit of {self.limits.max_batch_items}")

    def observations(self, value: Any) -> np.ndarray:
        """A batch -> validated (N, *obs_shape) array."""
        if isinstance(value, list) and not value:
            raise unprocessable("empty_batch", "observations is an empty list")
        if isinstance(value, list) and len(value) > self.limits.max_batch_items:
            raise self._too_large(len(value))
        arr = decode_array(value, "observations")
        if arr.ndim != len(self.obs_shape) + 1 or arr.shape[1:] != self.obs_shape:
            raise unprocessable(
                "bad_shape",
                f"observations has shape {fmt_shape(arr.shape)}, policy {self.policy_name!r} expects "
                f"(N, {', '.join(str(s) for s in self.obs_shape)})",
            )
        if arr.shape[0] == 0:
            raise unprocessable("empty_batch", "observations holds no observation")
        if arr.shape[0] > self.limits.max_batch_items:
            raise self._too_large(arr.shape[0])
        return self._check_values(arr, "observations")

    def frame(self, value: Any) -> np.ndarray:
        """One frame for a session: preprocessed (frame_shape, or without the channel axis) or, for Atari, raw RGB:
        the last two raw frames of a frame-skip step (2, H, W, 3), preprocessed and maxed in the trainer's order,
        or one raw frame (H, W, 3)."""
        if self.frame_shape is None:
            raise unprocessable("not_frame_stacked", f"policy {self.policy_name!r} does not stack frames; send 'observation'")
        arr = decode_array(value, "frame")
        fs = self.frame_shape
        raw = arr.shape[-1:] == (3,) and (arr.ndim == 3 or (arr.ndim == 4 and arr.shape[0] == 2))
        if self.atari_dim is not None and raw and arr.shape != fs:
            a64 = arr.astype(np.float64, copy=False)
            if not np.isfinite(a64).all() or (a64 < 0).any() or (a64 > 255).any() or not np.all(a64 == np.round(a64)):
                raise unprocessable("bad_dtype", "a raw RGB frame must hold integers in [0, 255]")
            from rl_envs.atari import preprocess_frame

            return preprocess_frame(arr.astype(np.uint8), dim=self.atari_dim)
        if arr.shape == fs[:-1] and fs[-1] == 1:
            arr = arr[..., None]
        if arr.shape != fs:
            expected = f"{fmt_shape(fs)}" + (" or raw RGB frames (2, H, W, 3) / (H, W, 3)" if self.atari_dim else "")
            raise unprocessable("bad_shape", f"frame has shape {fmt_shape(arr.shape)}, policy {self.policy_name!r} expects {expected}")
        # The stacked space's bounds repeat per frame; the first frame's slice bounds one frame.
        return self._check_values(arr, "frame", self.low[..., : fs[-1]], self.high[..., : fs[-1]])
