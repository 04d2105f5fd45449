import sys

from openroute.cli import main

sys.exit(main())
