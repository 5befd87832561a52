"""Graceful stop on SIGTERM (Kubernetes preemption, eviction, `kubectl delete`) and SIGINT (Ctrl-C).

The first signal asks the training loop to stop at the end of the current iteration, save a checkpoint if the
latest one is older than that iteration, and exit 143 (SIGTERM) / 130 (SIGINT); a rerun of the same command
resumes from it. Stopping is bounded: if the iteration and the save do not finish within
`fault_tolerance.stop_grace_s` (Kubernetes kills 30 s after SIGTERM by default), or a second signal comes, the
process exits at once with the same code and says which checkpoint a rerun will resume from.
Installed after `ray.init`, which replaces Python's handlers with Ray's C++ ones (those print a stack dump).

Under Tune (tune != none) the first signal is handed to Tune as SIGUSR1, its own "interrupt the experiment" signal:
Tune stops the trials, saves the experiment state and returns, and a rerun of the same command restores the
experiment (Tuner.restore) and resumes each unfinished trial from its latest checkpoint. Tune's SIGINT handler is
disabled (TUNE_DISABLE_SIGINT_HANDLER) so both signals take this one path.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}


class Stopped(Exception):
    """Raised by the training loop once it has stopped for a signal; carries what the user needs to know."""

    def __init__(self, signum: int, checkpoint: str | None, saved: bool, experiment: str | None = None):
        self.signum, self.checkpoint, self.saved = signum, checkpoint, saved
        self.code = CODES.get(signum, 128 + signum)
        name = signal.Signals(signum).name
        if experiment is not None:
            what = (f"Tune experiment state saved in {experiment}; rerun the same command to resume its trials"
                    + (f" (best trial's latest checkpoint: {checkpoint})" if checkpoint else ""))
        elif checkpoint is None:
            what = "no checkpoint yet; a rerun starts afresh"
        elif saved:
            what = f"checkpoint saved: {checkpoint}; rerun the same command to resume from it"
        else:
            what = f"latest checkpoint {checkpoint} is current; rerun the same command to resume from it"
        super().__init__(f"stopped by {name}: {what}")


class GracefulStop:
    """Signal handlers plus a watchdog; `requested` is the signal number once one arrived (else None)."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self.grace_s = 25.0
        self.latest: Callable[[], str | None] = lambda: None
        self._timer: threading.Timer | None = None
        self._forward: int | None = None

    def install(self, grace_s: float, latest: Callable[[], str | None] | None = None, tune: bool = False) -> None:
        """tune=True: the first signal is passed on to Tune as SIGUSR1 (see the module docstring)."""
        self.grace_s = grace_s
        if latest is not None:
            self.latest = latest
        if tune:
            self._forward = signal.SIGUSR1
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        for sig in CODES:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        if self.requested is not None:  # a second signal: stop now
            self._exit_now(signum, "second signal")
        self.requested = signum
        print(f"[trainer] {signal.Signals(signum).name} received: finishing the iteration, then checkpoint and exit "
              f"(at most {self.grace_s:g}s; send it again to exit at once)", flush=True)
        self._timer = threading.Timer(self.grace_s, self._exit_now, (signum, f"not done within {self.grace_s:g}s"))
        self._timer.daemon = True
        self._timer.start()
        # Tune's handler (installed by Tuner.fit) ends the experiment; before fit there is none (SIGUSR1's default
        # would kill the process) and run_tune checks `requested` instead.
        if self._forward is not None and signal.getsignal(self._forward) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            signal.raise_signal(self._forward)

    def _exit_now(self, signum: int, why: str) -> None:
        latest = self.latest()
        resume = f"a rerun resumes from {latest}" if latest else "no checkpoint yet; a rerun starts afresh"
        print(f"error: stopped by {signal.Signals(signum).name} ({why}) without a new checkpoint: {resume}",
              file=sys.stderr, flush=True)
        os._exit(CODES.get(signum, 128 + signum))

    def done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


STOP = GracefulStop()
