"""The project's one base exception.

Every error blockx raises on purpose derives from `BlockxError`. This module
imports nothing so that the pure cores can depend on it.
"""


class BlockxError(Exception):
    """Base of every error raised by blockx."""
