"""`python -m blockx`: the command line (see `blockx.cli`)."""

from blockx.process.lifecycle import cache_own_bytecode

cache_own_bytecode()  # before the imports it speeds up, and the executors' imports

from blockx.cli import main  # noqa: E402

raise SystemExit(main())
