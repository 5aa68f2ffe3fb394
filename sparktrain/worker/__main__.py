"""Entry point of each rank's process: ``python -m sparktrain.worker``."""

import atexit
import logging
import os
import sys

from sparktrain.worker.bootstrap import main

code = main()
# By now the rank has written everything it owes the driver. Run the atexit handlers users
# expect, then leave without interpreter teardown: destroying communication objects (gloo's
# and NCCL's threads) while a peer has already exited can abort the process ("terminate
# called without an active exception"), turning a finished rank into a crashed one.
try:
    atexit._run_exitfuncs()
finally:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)
