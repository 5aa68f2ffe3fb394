"""``horovod.common``: the parts elastic scripts import (``exceptions``, ``elastic``)."""
