"""The build: pyproject.toml has the metadata; this adds ``sparktrain-horovod.pth`` to the wheel.

The ``.pth`` file runs ``_sparktrain_horovod.install()`` when an interpreter of the
environment starts, so that ``import horovod.torch`` works on a driver without Horovod (see
``_sparktrain_horovod``). setuptools copies only packages and modules into the wheel; a
``.pth`` must sit at the top of site-packages, so ``build_py`` copies it there itself, into
the wheel's build folder (or, for an editable install, among that wheel's own files).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "sparktrain-horovod.pth"


class BuildPyWithPth(build_py):
    """``build_py`` that also puts :data:`PTH` at the top of the build folder."""

    def run(self):
        super().run()
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            # An editable wheel holds links to the sources, not build_lib: the file goes
            # where that wheel's own files are gathered (its install_lib).
            target = self.get_finalized_command("install").install_lib
        self.copy_file(PTH, os.path.join(target, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
