"""`rl-export`: export a checkpoint's policy to a self-contained TorchScript file, checked for parity.

    rl-export --checkpoint outputs/cartpole_ppo/checkpoints/final --out policy.pt
    python -m serving.export --checkpoint DIR --out policy.pt --verify 1024

The file holds `forward(obs: Tensor[N, *obs_shape] float32) -> Tensor[N, logits]` (the RLModule's
`action_dist_inputs`) and, as TorchScript extra file `policy.json`, the observation/action spaces, frame stacking,
checkpoint id and the greedy rule (argmax for Discrete, per-sub-space argmax for MultiDiscrete, first half = mean
for Box). Load it anywhere with plain torch: `m = torch.jit.load("policy.pt", _extra_files={"policy.json": ""})`.

Parity: after writing, the file is loaded back and its greedy actions are compared with the RLModule's
`forward_inference` on `--verify` observations sampled from the observation space; any mismatch fails the export.
TorchScript rather than ONNX: `onnx` is not a project dependency, and TorchScript needs only torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rl_checkpoint import CheckpointError, is_uri
from serving.codec import space_to_json
from serving.policy import LoadedPolicy


def sample_observations(policy: LoadedPolicy, n: int, seed: int = 0) -> np.ndarray:
    """Observations spread over the space (unbounded dims: N(0, 1.5)), in the space's dtype."""
    space = policy.observation_space
    rng = np.random.default_rng(seed)
    low = np.broadcast_to(space.low, space.shape).astype(np.float64)
    high = np.broadcast_to(space.high, space.shape).astype(np.float64)
    normal = rng.normal(0.0, 1.5, size=(n,) + space.shape)
    uni = rng.uniform(np.nan_to_num(low, neginf=-1.0), np.nan_to_num(high, posinf=1.0), size=(n,) + space.shape)
    bounded = np.isfinite(low) & np.isfinite(high)
    x = np.where(bounded, uni, np.clip(normal, low, high))
    return x.astype(space.dtype)


def reference_actions(policy: LoadedPolicy, obs: np.ndarray) -> list[Any]:
    """Greedy actions through RLlib's public `forward_inference` on the module as loaded from the checkpoint."""
    return policy.greedy(policy.inference.reference_logits(obs))


def _wrapper(policy: LoadedPolicy):
    import torch

    class PolicyLogits(torch.nn.Module):
        def __init__(self, module: torch.nn.Module):
            super().__init__()
            self.module = module

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.module._forward_inference({"obs": obs})["action_dist_inputs"]

    return PolicyLogits(policy.inference.inference_module).eval()


def export_torchscript(checkpoint: str, out: str | Path, verify: int = 256) -> dict[str, Any]:
    policy = LoadedPolicy.load("export", checkpoint)
    try:
        return _export(policy, out, verify)
    finally:
        policy.release()


def _export(policy: LoadedPolicy, out: str | Path, verify: int) -> dict[str, Any]:
    import torch

    wrapper = _wrapper(policy)
    example = torch.from_numpy(sample_observations(policy, 2, seed=1))
    with torch.inference_mode():
        traced = torch.jit.trace(wrapper, example, check_trace=True)
    meta = {
        "format": "torchscript",
        "format_version": 1,
        "checkpoint_id": policy.checkpoint_id,
        "checkpoint": policy.checkpoint,
        "env": policy.env,
        "framestack": policy.framestack,
        "observation_space": space_to_json(policy.observation_space),
        "action_space": space_to_json(policy.action_space),
        "greedy": policy.greedy.rule,
        "input": "obs: float tensor (N, *observation_space.shape), frames already stacked and preprocessed",
        "output": "action_dist_inputs (N, logits)",
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(traced, str(out), _extra_files={"policy.json": json.dumps(meta)})
    result: dict[str, Any] = {"out": str(out), "bytes": out.stat().st_size, **{k: meta[k] for k in ("checkpoint_id", "env")}}
    if verify > 0:
        result["parity"] = check_parity(policy, out, verify)
    return result


def check_parity(policy: LoadedPolicy, exported: str | Path, n: int, seed: int = 7) -> dict[str, Any]:
    """Greedy actions of the exported file vs the RLModule on `n` sampled observations."""
    import torch

    loaded = torch.jit.load(str(exported))
    obs = sample_observations(policy, n, seed=seed)
    want = reference_actions(policy, obs)
    with torch.inference_mode():
        logits = loaded(torch.from_numpy(obs)).numpy()
    got = policy.greedy(logits)
    mismatches = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    return {"observations": n, "mismatches": len(mismatches), "first_mismatch": mismatches[:1] or None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rl-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint dir, run output_dir or URI (from `make train`)")
    p.add_argument("--out", default=None, help="output file (default: <checkpoint>/export/policy.pt)")
    p.add_argument("--format", choices=("torchscript",), default="torchscript")
    p.add_argument("--verify", type=int, default=256, help="observations for the parity check; 0 skips it")
    args = p.parse_args(argv)
    out = args.out or (str(Path(args.checkpoint) / "export" / "policy.pt") if not is_uri(args.checkpoint) else None)
    if out is None:
        print("rl-export: error: --out is required when --checkpoint is a URI", file=sys.stderr)
        return 2
    try:
        res = export_torchscript(args.checkpoint, out, args.verify)
    except CheckpointError as e:
        print(f"rl-export: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    if res.get("parity", {}).get("mismatches"):
        print(f"rl-export: error: exported policy disagrees with the RLModule: {res['parity']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
