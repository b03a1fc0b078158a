"""`blockx` (the console script) and `python -m blockx`: the command line (see `blockx.cli`)."""

from blockx.process.lifecycle import cache_own_bytecode


def main() -> int:
    """Run the command line; its exit status."""
    cache_own_bytecode()  # before the imports it speeds up, and the executors' imports
    from blockx.cli import main as run  # noqa: PLC0415  # after the cache is written

    return run()


if __name__ == "__main__":
    raise SystemExit(main())
