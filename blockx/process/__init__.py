"""What every blockx process shares, whichever product it runs.

Public modules, each imported on its own so that a process loads only what it
uses:

* `blockx.process.clock`: `EpochClock`, epoch milliseconds read from Trio's clock.
* `blockx.process.signals`: the signal rule (the first SIGINT/SIGTERM drains,
  the second exits at once) and `watch_signals`, which applies it.
* `blockx.process.lifecycle`: start-up settings of blockx's own processes (GC,
  bytecode cache), their RSS, private directories removed even on an exit at
  once, and unwrapping a lone error from an exception group.
"""
