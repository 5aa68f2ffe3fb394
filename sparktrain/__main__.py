"""``python -m sparktrain``: the ``sparktrain`` command."""

import sys

from sparktrain.commands.cli import main

sys.exit(main())
