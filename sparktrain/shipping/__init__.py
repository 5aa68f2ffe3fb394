"""What crosses from the driver to the ranks and back: the pickled function and its
result (``payload``), the check of its arguments against its signature (``signature``),
scripts run as ``__main__`` (``script``) and results kept on disk (``kept``)."""
