"""User-facing errors: printed as one line naming the problem, exit code 2."""


class TrainerError(Exception):
    """A problem the user can fix (bad config, missing checkpoint, unreachable cluster)."""
