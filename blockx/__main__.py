"""`python -m blockx`: the command line (see `blockx.cli`)."""

from blockx.cli import main

raise SystemExit(main())
