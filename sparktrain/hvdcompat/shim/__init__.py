"""Not imported as ``sparktrain.hvdcompat.shim`` at run time: this folder itself goes first on a
rank's ``sys.path``, so that its ``horovod`` package shadows any installed Horovod there."""
