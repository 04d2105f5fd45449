"""``python -m openroute``: the ``openroute`` command line (:func:`openroute.cli.main`)."""

import sys

from openroute.cli import main

sys.exit(main())
