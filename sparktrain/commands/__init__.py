"""The ``sparktrain`` command (``run``, ``doctor``, ``install-horovod``) and the checks the
doctor makes: code that a person starts from a shell, not code a run imports."""
