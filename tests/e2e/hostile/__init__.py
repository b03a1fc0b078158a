"""Hostile input against one real worker process: generated requests for every RPC,
garbage on its TCP port and on its executors' socket."""
