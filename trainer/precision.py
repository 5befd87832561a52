"""algo.precision -> mixed-precision learners through RLlib's own hooks (fp32 | bf16 | fp16).

RLlib 2.58 has no precision switch. What its TorchLearner supports is a loss scaler
(`AlgorithmConfig.experimental(_torch_grad_scaler_class=...)`, applied in compute_gradients/apply_gradients) and a
custom `learner_class`; its mixed-precision example runs the learner's `_update` under `torch.autocast`. We do the
same, narrowed to the forward pass: the network runs in bf16/fp16, the loss is computed from fp32 copies of the
outputs and the backward runs outside autocast (as torch's AMP guide recommends). Parameters and optimizer state
stay fp32, so checkpoints are ordinary fp32 RLModules that serve unchanged. Env runners keep fp32 inference.

fp16 needs loss scaling and a CUDA device (torch's GradScaler is CUDA-only here); bf16 has fp32's exponent range
and needs no scaler, so it is the CPU choice. trainer.validate rejects fp16 without GPU learners before Ray starts.
"""

from __future__ import annotations

import functools
from typing import Any

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


class AutocastLearnerMixin:
    """Put in front of an algorithm's TorchLearner: forward under autocast, loss and backward in fp32."""

    autocast_dtype: str = "bfloat16"

    def _autocast(self, enabled: bool = True):
        import torch

        device = getattr(self, "_device", None)
        device_type = device.type if isinstance(device, torch.device) else "cpu"
        return torch.autocast(device_type=device_type, dtype=getattr(torch, self.autocast_dtype), enabled=enabled)

    def _update(self, *args, **kwargs):
        with self._autocast():
            return super()._update(*args, **kwargs)

    def compute_losses(self, *, fwd_out, batch, **kwargs):
        import torch
        import tree

        def to_fp32(x):
            return x.float() if torch.is_tensor(x) and x.is_floating_point() else x

        with self._autocast(enabled=False):
            return super().compute_losses(fwd_out=tree.map_structure(to_fp32, fwd_out), batch=batch, **kwargs)

    def compute_gradients(self, *args, **kwargs):
        with self._autocast(enabled=False):
            return super().compute_gradients(*args, **kwargs)


def learner_class(base: type, precision: str) -> type:
    """`base` (the algorithm's default TorchLearner) with autocast in `precision`; cloudpickle ships it by value."""
    attrs = {"autocast_dtype": _DTYPES[precision], "__module__": __name__}
    return type(f"{base.__name__}_{precision}", (AutocastLearnerMixin, base), attrs)


def apply_precision(config, precision: str):
    """AlgorithmConfig -> the same config training in `precision` (fp32 returns it untouched)."""
    if precision == "fp32":
        return config
    if precision not in _DTYPES:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    config = config.learners(learner_class=learner_class(config.get_default_learner_class(), precision))
    if precision == "fp16":
        import torch

        config = config.experimental(_torch_grad_scaler_class=functools.partial(torch.amp.GradScaler, "cuda"))
    return config


def check(precision: str, num_learners: int, num_gpus_per_learner: float, grad_clip: Any) -> str | None:
    """The problem with this combination as one line, or None."""
    if precision not in PRECISIONS:
        return f"algo.precision must be one of {', '.join(PRECISIONS)}, not {precision!r}"
    if precision == "fp16" and (num_learners < 1 or num_gpus_per_learner <= 0):
        return ("algo.precision=fp16 needs GPU learners (resources.num_learners >= 1 and "
                "resources.num_gpus_per_learner > 0); on CPU use algo.precision=bf16")
    if precision == "fp16" and grad_clip is not None:
        return "algo.precision=fp16 scales the loss, so algo.grad_clip would clip scaled gradients; set algo.grad_clip=null"
    return None
