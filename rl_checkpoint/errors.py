"""The one error type of the checkpoint contract."""


class CheckpointError(Exception):
    """A checkpoint or run location that cannot be read or written: missing, partial, wrong layout, unreachable.

    The message names the location and is fit to print as one line (no traceback needed)."""


class RegistryError(CheckpointError):
    """A policy registry operation that cannot be done: unknown policy, version or alias, a registry root that
    does not exist or cannot be written, a checkpoint for another env, a refused promotion. One line to print;
    `exit_code` is what `rl-policy` exits with (2: bad input or refused; 3: the registry stayed busy)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
