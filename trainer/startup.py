"""Start-up phases of a run (imports, ray.init, algorithm build, first sample), and the overlap that shortens them.

`ray.init` spends most of its time waiting for Ray's own processes (GCS, raylet, agents) to come up; the driver's
heavy imports (torch, torch._dynamo, which torch.optim pulls in lazily at the first optimizer, and RLlib's algorithm
modules) need a core for seconds. `prewarm` runs those imports in a thread while the main thread runs `ray.init`,
so the two overlap instead of adding up (bench/startup_bench.py measures both orders side by side).

The phases are wall-clock intervals of the main thread, so they add up to the time before the first sample:
imports (process start -> ray.init, plus any wait for the import thread after it), ray.init, build (config ->
built Algorithm), then first-sample (the env runners' sampling time inside the first iteration).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def _process_start() -> float:
    try:
        import psutil  # a Ray dependency

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - no /proc: count from the first import of this module instead
        return time.time()


class Startup:
    def __init__(self) -> None:
        self.t0 = _process_start()
        self.phases: dict[str, float] = {}
        self._last = self.t0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def mark(self, phase: str) -> None:
        """Add the time since the previous mark to `phase` (a phase may be entered more than once)."""
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def prewarm(self, algo_name: str, torch_threads: int) -> None:
        """Import what building the algorithm needs, in a thread; `wait_imports` joins it."""
        self.mark("imports")
        # Before ray.init: Ray's processes (and so its workers) inherit it; torch reads it at import.
        os.environ["OMP_NUM_THREADS"] = str(torch_threads)

        def work() -> None:
            try:
                import torch._dynamo  # noqa: F401 - torch.optim imports it at the first optimizer (~2.8 s)

                import trainer.algo as algo
                from ray.rllib.core.learner.torch.torch_learner import TorchLearner  # noqa: F401
                from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner  # noqa: F401

                algo._algo_config_class(algo_name)
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread by wait_imports
                self._error = e

        self._thread = threading.Thread(target=work, name="trainer-prewarm", daemon=True)
        self._thread.start()

    def wait_imports(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.mark("imports")
        if self._error is not None:
            raise self._error

    def first_result(self, result: dict[str, Any]) -> None:
        """After the first training iteration: close the build phase, record the first sample's time."""
        timers = result.get("timers", {})
        sample = timers.get("env_runner_sampling_timer") if isinstance(timers, dict) else None
        self.phases["before_first_sample"] = sum(self.phases.get(k, 0.0) for k in ("imports", "ray.init", "build"))
        if isinstance(sample, (int, float)):
            self.phases["first-sample"] = float(sample)

    def line(self) -> str:
        parts = [f"{k} {self.phases[k]:.1f}s" for k in ("imports", "ray.init", "build", "first-sample") if k in self.phases]
        tail = f" ({self.phases['before_first_sample']:.1f}s before the first sample)" if "before_first_sample" in self.phases else ""
        return "startup: " + " ".join(parts) + tail

    def summary(self) -> dict[str, float]:
        return {k.replace("-", "_").replace(".", "_"): round(v, 2) for k, v in self.phases.items()}


# One per process: the trainer's entry point and its training loop share it.
STARTUP = Startup()
