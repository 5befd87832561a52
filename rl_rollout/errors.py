"""Exit codes and the one error type of rl-rollout."""

from __future__ import annotations

EXIT_OK, EXIT_INVALID, EXIT_ROLLED_BACK, EXIT_PAUSED, EXIT_ABORTED, EXIT_INTERRUPTED = 0, 2, 3, 4, 5, 130


class RolloutError(Exception):
    """Something the user can fix or must know; printed as one line `error: ...`, exit `code`."""

    def __init__(self, message: str, code: int = EXIT_INVALID):
        super().__init__(" ".join(str(message).split()))  # one line, whatever a nested error held
        self.code = code


class FiguresUnavailable(Exception):
    """The figures source could not answer this interval (unreachable, a query error, a malformed answer)."""
