"""The one error type of the checkpoint contract."""


class CheckpointError(Exception):
    """A checkpoint or run location that cannot be read or written: missing, partial, wrong layout, unreachable.

    The message names the location and is fit to print as one line (no traceback needed)."""
