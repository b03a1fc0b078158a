"""blockx: a worker node for a distributed task platform."""

__version__ = "0.1.0"
