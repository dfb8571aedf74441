"""``python -m pairaudit.cli`` = the ``pairaudit`` console script."""

import sys

from pairaudit.cli import main

sys.exit(main())
