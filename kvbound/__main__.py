"""``python -m kvbound``: the console script (``kvbound.cli.main``)."""

import sys

from kvbound.cli import main

sys.exit(main())
