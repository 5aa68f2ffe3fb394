"""Entry point of each rank's process: ``python -m sparktrain.worker``."""

import sys

from sparktrain.worker.bootstrap import main

sys.exit(main())
