"""HorovodRunner on two hosts: Horovod's own view of local and cross ranks, over Gloo and
over mpirun (whose daemon on the other host starts through that host's barrier task)."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from sparktrain import HorovodRunner
from sparktrain.backends.horovod_install import _links_mpi, horovod_torch_library
from tests.fixtures import hvd_trainers

_LIBRARY = horovod_torch_library()

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.horovod,
    pytest.mark.skipif(
        _LIBRARY is None or importlib.util.find_spec("horovod") is None,
        reason="horovod.torch is not importable: build it with scripts/install-horovod.sh",
    ),
]


@pytest.fixture(params=["gloo", "mpi"])
def launcher(request: pytest.FixtureRequest) -> str:
    """Horovod's Gloo rendezvous, or mpirun (skipped without Open MPI)."""
    if request.param == "mpi" and not (
        _LIBRARY is not None and shutil.which("mpirun") and _links_mpi(_LIBRARY)
    ):
        pytest.skip("mpirun and Horovod built with MPI are needed (scripts/install-horovod.sh)")
    return str(request.param)


def test_horovod_local_and_cross_ranks_on_two_hosts(cluster_spark, launcher):
    places = HorovodRunner(np=4, launcher=launcher).run(hvd_trainers.places)
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    for p in places:
        assert p["size"] == 4 and p["local_size"] == 2 and p["cross_size"] == 2
        assert p["local_rank"] == p["env_local_rank"] == p["rank"] % 2
        assert p["cross_rank"] == p["rank"] // 2  # ranks are numbered host by host
        # The rank pins the GPU of its own task: the two executors of a host hold 0 and 1.
        assert p["pinned"] is not None and sorted(p["visible"].split(",")) == ["0", "1"]
    # Each host's pair of ranks pinned distinct GPUs.
    assert places[0]["pinned"] != places[1]["pinned"]
    assert places[2]["pinned"] != places[3]["pinned"]


def test_every_task_a_node_of_its_own_to_horovod_on_two_hosts(cluster_spark):
    # node="task": each of the 4 tasks (2 per host) is a host of its own to Horovod's Gloo
    # rendezvous, so hvd.local_rank() is LOCAL_RANK (0) and each rank sees its own GPU alone.
    places = HorovodRunner(np=4, launcher="gloo", node="task").run(hvd_trainers.places)
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    for p in places:
        assert p["size"] == 4 and p["local_size"] == 1 and p["cross_size"] == 4
        assert p["local_rank"] == p["env_local_rank"] == 0
        assert p["cross_rank"] == p["rank"]
        assert p["visible"] in ("0", "1") and p["pinned"] == p["visible"]
    # The two tasks of a host hold its two GPUs.
    assert {places[0]["pinned"], places[1]["pinned"]} == {"0", "1"}
    assert {places[2]["pinned"], places[3]["pinned"]} == {"0", "1"}


def test_horovod_ranks_talk_over_the_probed_interface(cluster, cluster_spark, launcher):
    from tests.cluster.hosts import HOST_IF
    from tests.fixtures import nic_trainers

    reports = HorovodRunner(np=4, launcher=launcher).run(nic_trainers.hvd_interfaces)
    addresses = {h.address for h in cluster.hosts.hosts}
    for r in reports:
        assert r["sum"] == 4.0
        assert r["GLOO_SOCKET_IFNAME"] == HOST_IF and r["NCCL_SOCKET_IFNAME"] == HOST_IF
        if launcher == "mpi":
            # mpirun hands its -mca settings to every rank: TCP stays off the decoy docker0.
            assert r["OMPI_MCA_btl_tcp_if_include"] == HOST_IF
            assert r["OMPI_MCA_oob_tcp_if_include"] == HOST_IF
        else:
            assert r["HOROVOD_GLOO_IFACE"] == HOST_IF
            assert r["HOROVOD_GLOO_RENDEZVOUS_ADDR"] in addresses


def test_gloo_refuses_a_host_whose_name_resolves_to_loopback(cluster, cluster_spark):
    from sparktrain.errors import ConfigurationError
    from tests.cluster.hosts import NETNS_ETC

    host = cluster.hosts.hosts[1]
    # The host's /etc/hosts (bind-mounted from here): its name on loopback, as Debian writes it.
    hosts_file = NETNS_ETC / host.netns / "hosts"
    good = hosts_file.read_text()
    hosts_file.write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.netns}\n")
    try:
        with pytest.raises(ConfigurationError) as raised:
            HorovodRunner(np=4, launcher="gloo").run(hvd_trainers.places)
    finally:
        hosts_file.write_text(good)
    message = str(raised.value)
    assert f"Not so on {host.address}: its name resolves to 127.0.1.1." in message
    assert "launcher='mpi'" in message and "horovod_impl='builtin'" in message
    # Put back, the host runs Horovod over Gloo again.
    assert [p["rank"] for p in HorovodRunner(np=4).run(hvd_trainers.places)] == [0, 1, 2, 3]
