"""The Trio actors that run the pure cores: one task and one bounded inbox each."""

from blockx.actors._dispatcher import CallsRefused, ExecutorPool, split_wire_call_id, wire_call_id

__all__ = ["CallsRefused", "ExecutorPool", "split_wire_call_id", "wire_call_id"]
