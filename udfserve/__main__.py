"""``python -m udfserve``: the ``udfserve`` command where its console script is not on PATH."""

from udfserve.services.cli import main

raise SystemExit(main())
