"""Errors whose message alone tells the user what failed and what to do: train.py prints them as one line."""


class UserFacingError(RuntimeError):
    """Printed as one line, no traceback."""


class RunStopped(UserFacingError):
    """The run cannot go on (a learner died, the loss stays non-finite); the message says how to resume."""
