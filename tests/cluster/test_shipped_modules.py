"""A notebook's helper modules reach ranks on hosts that do not have them: the project folder
is on the driver's own disk (HOST_DISK, which every host has with contents of its own), so the
ranks can import the helpers only from the copies that travel with the run."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from tests.cluster.hosts import HOST_DISK

pytestmark = pytest.mark.cluster

PROJECT = {
    "cl_helper.py": "import cl_base\n\n\ndef value():\n    return cl_base.BASE + 2\n",
    "cl_base.py": "BASE = 40\n",
    "cl_pkg/__init__.py": "",
    "cl_pkg/hosts.py": "import socket\n\n\ndef where():\n    return socket.gethostname()\n",
    "train.py": "import cl_helper\n\nassert cl_helper.value() == 42\n",
}

# The notebook's cell: a function pickled by value, using a helper it imported at the top and
# one it imports in its body.
CELL = """
import cl_helper


def train():
    import sys
    from cl_pkg import hosts
    return cl_helper.value(), hosts.where(), sys.modules["cl_helper"].__file__
"""


@pytest.fixture
def project(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The notebook's folder on the driver's disk alone, its working folder."""
    folder = Path(tempfile.mkdtemp(prefix="project-", dir=HOST_DISK))
    try:
        for rel, text in PROJECT.items():
            (folder / rel).parent.mkdir(exist_ok=True)
            (folder / rel).write_text(text)
        monkeypatch.chdir(folder)
        monkeypatch.syspath_prepend("")
        yield folder
    finally:
        for name in [n for n in sys.modules if n.startswith("cl_")]:
            del sys.modules[name]
        shutil.rmtree(folder)


def notebook_train() -> Any:
    namespace: dict[str, Any] = {"__name__": "shipped_modules_cluster_cell"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)
    return namespace["train"]


def test_helper_modules_reach_ranks_on_hosts_without_the_project_folder(
    cluster, cluster_spark, project
):
    train = notebook_train()
    with pytest.raises(WorkerFailedError) as info:
        SparkRunner(np=2, ship_modules=False).run(train)
    assert "No module named 'cl_helper'" in str(info.value)  # no host has the folder

    results = SparkRunner(np=4).run_all(train)
    assert [value for value, _, _ in results] == [42] * 4
    hosts = {host for _, host, _ in results}
    assert hosts == {h.netns for h in cluster.hosts.hosts}
    for _, _, file in results:  # the rank's own copy, not the driver's file
        assert "/modules-" in file and file.endswith("/cl_helper.py"), file
        assert not file.startswith(str(project))


def test_a_script_s_own_modules_reach_ranks_on_hosts_without_its_folder(
    cluster, cluster_spark, project, monkeypatch
):
    monkeypatch.chdir(HOST_DISK)  # the script's folder, not the working folder, is what counts
    assert SparkRunner(np=4).run_all(str(project / "train.py")) == [None] * 4
