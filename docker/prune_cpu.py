"""Shrink the CPU image's venv when torch is PyPI's CUDA build (the only torch wheel PyPI has for Linux x86_64).

`import torch` of that build loads a fixed set of CUDA libraries (libtorch_cuda.so needs them) even on a machine
without a GPU, so the nvidia-* wheels cannot simply be left out. Everything else in them (cuDNN's engine
libraries, cuSOLVER, NVRTC's alt build, profiler libraries, ...) is only dlopen()ed once a CUDA device is used,
which never happens in the CPU image. This script:
  1. imports torch (and RLlib) in a child process, runs CPU work, and records which nvidia libraries got mapped;
  2. deletes the nvidia shared libraries that were not, and triton (torch.compile's GPU backend);
  3. runs the same child again and fails the build if anything changed (import error, CUDA suddenly "available",
     a library missing).
A torch without nvidia-* deps (e.g. from the CPU wheel index) is left alone. Use the GPU image on GPU nodes.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

SITE = sysconfig.get_paths()["purelib"]
NVIDIA = os.path.join(SITE, "nvidia")

PROBE = r"""
import json
import torch
import ray.rllib  # noqa: F401  (imports torch the way the trainer does)
x = torch.randn(64, 32, requires_grad=True)
w = torch.nn.Linear(32, 4)
loss = torch.nn.functional.cross_entropy(w(x), torch.randint(0, 4, (64,)))
loss.backward()
torch.linalg.solve(torch.eye(4) * 2, torch.ones(4))
maps = {l.split()[-1] for l in open("/proc/self/maps") if "/nvidia/" in l}
print(json.dumps({"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                  "grad": x.grad is not None, "nvidia": sorted(maps)}))
"""


def probe():
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if not os.path.islink(os.path.join(d, f)))


def main():
    if not os.path.isdir(NVIDIA):
        print("prune_cpu: torch has no nvidia-* libraries here; nothing to prune")
        return
    before = probe()
    assert not before["cuda"] and before["grad"], before
    keep = {os.path.realpath(p) for p in before["nvidia"]}
    size0 = du(NVIDIA)
    removed = []
    for d, _, files in os.walk(NVIDIA):
        for f in files:
            p = os.path.join(d, f)
            if ".so" in f and os.path.realpath(p) not in keep:
                removed.append(p)
                os.remove(p)
    triton = os.path.join(SITE, "triton")
    if os.path.isdir(triton):
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "triton"], check=True)
    after = probe()
    assert after == before, (before, after)
    assert not os.path.exists(triton)
    print(f"prune_cpu: torch {after['torch']} imports and trains on CPU with {len(keep)} nvidia libraries; "
          f"removed {len(removed)} unused ones ({(size0 - du(NVIDIA)) / 1e6:.0f} MB) and triton")
    for p in sorted(removed):
        print("  -", os.path.relpath(p, SITE))


if __name__ == "__main__":
    main()
