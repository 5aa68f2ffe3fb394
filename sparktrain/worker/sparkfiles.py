"""``pyspark.SparkFiles.get`` inside a rank, without importing pyspark unless the rank does.

In a Spark task, PySpark's worker tells ``SparkFiles`` where the task's files are. A rank is a
process of its own, in which ``SparkFiles`` would look for a SparkContext and fail. The
supervisor passes the task's SparkFiles root in :data:`~sparktrain.contract.SPARK_FILES_ENV`;
an import hook sets it on ``SparkFiles`` the moment the rank imports the module that defines
it, so ranks that never use it pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from sparktrain import contract

# Where SparkFiles is defined: PySpark 4 (``pyspark.files`` re-exports it), and PySpark 3.
MODULES = ("pyspark.core.files", "pyspark.files")


def _point_at(module: ModuleType, root: str) -> None:
    spark_files = getattr(module, "SparkFiles", None)
    if spark_files is not None and spark_files.__module__ == module.__name__:
        spark_files._root_directory = root
        spark_files._is_running_on_worker = True


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the root set on its SparkFiles."""

    def __init__(self, inner: importlib.abc.Loader, root: str) -> None:
        self._inner = inner
        self._root = root

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _point_at(module, self._root)

    def __getattr__(self, name: str) -> Any:  # get_source etc., for tracebacks and inspect
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, root: str) -> None:
        self._root = root

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self._root)
        return spec


def expose_spark_files() -> None:
    """Make ``SparkFiles`` in this process find the task's files, when the task told us where."""
    root = os.environ.get(contract.SPARK_FILES_ENV)
    if not root:
        return
    for name in MODULES:
        if name in sys.modules:
            _point_at(sys.modules[name], root)
    sys.meta_path.insert(0, _Finder(root))
