"""What lets operators see inside a worker: logs, traces, metrics and the status page.

Each module is imported by name (`blockx.observability.logs`, ...); this
package re-exports nothing.
"""
