"""``launcher="mpi"``: mpirun on rank 0's task creates every rank, no SSH needed.

* :mod:`~sparktrain.task.mpi.mpi_launcher` — the task's side of the launcher seam: one event loop
  that plays this task's roles;
* :mod:`~sparktrain.task.mpi.mpirun` — the launcher role (rank 0's task runs mpirun and
  builds every rank's record);
* :mod:`~sparktrain.task.mpi.hosts` — the host role (a task starts Open MPI's daemon for its
  host when mpirun's agent asks) and a member's link to the launcher;
* :mod:`~sparktrain.task.mpi.command` — the mpirun command line and reading its output (pure);
* :mod:`~sparktrain.task.mpi.peers` — the authenticated listener the roles talk through;
* :mod:`~sparktrain.task.mpi.rsh` and :mod:`~sparktrain.task.mpi.guard` — the small programs
  mpirun runs: its remote-shell agent, and the guard that ties a launcher to its task.
"""
