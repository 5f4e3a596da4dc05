"""``python -m meshplan`` runs the command line."""

import sys

from meshplan.cli import main

sys.exit(main())
