"""Entry point of each rank's process: ``python -m sparktrain.worker``."""

from sparktrain.worker.bootstrap import exit_rank, main

exit_rank(main())
