"""The mpirun command line and reading mpirun's output back: pure functions, no MPI needed."""

from __future__ import annotations

import pytest

from sparktrain import contract
from sparktrain.backends import get_backend
from sparktrain.config import RunConfig
from sparktrain.layout.cluster import TaskInfo, build_cluster_spec
from sparktrain.task.mpi import command as mpi


def spec_of(hosts: list[str], ifnames: list[str | None] | None = None):
    names = ifnames or [None] * len(hosts)
    return build_cluster_spec(
        [TaskInfo(index=i, host=h, port=7000 + i, ifname=names[i]) for i, h in enumerate(hosts)]
    )


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _mca(argv: list[str]) -> dict[str, str]:
    return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "-mca"}


@pytest.mark.parametrize(
    "hosts, expected",
    [
        (["a"], "a:1"),
        (["a", "a"], "a:2"),
        (["a", "b", "a", "b"], "a:2,b:2"),  # ranks contiguous per host, hosts by first task
        (["b", "a", "c", "a"], "b:1,a:2,c:1"),
    ],
)
def test_host_list_follows_the_cluster_spec(hosts, expected):
    argv = mpi.mpirun_command(spec_of(hosts), python="/py", mpirun="/mpirun", as_root=False)
    assert _option(argv, "-H") == expected
    assert _option(argv, "-np") == str(len(hosts))
    assert argv[-3:] == ["/py", "-m", "sparktrain.worker"]


def test_command_uses_the_agent_and_keeps_daemons_attached():
    argv = mpi.mpirun_command(spec_of(["a", "b"]), python="/py", mpirun="/mpirun", as_root=True)
    assert argv[:2] == ["/mpirun", "--allow-run-as-root"]
    mca = _mca(argv)
    assert mca["plm_rsh_agent"] == "/py -m sparktrain.task.mpi.rsh"
    assert mca["plm_rsh_no_tree_spawn"] == "1"
    # Open MPI's own stop of the ranks after a failure takes 2 steps of this: kept short.
    assert mca["odls_base_sigkill_timeout"] == "1"
    assert "--leave-session-attached" in argv and "--tag-output" in argv
    assert _option(argv, "-map-by") == "slot" and _option(argv, "-bind-to") == "none"


def test_extra_args_go_before_the_program_as_separate_tokens():
    extra = ("-x", "NCCL_DEBUG=INFO", "--bind-to", "none")
    argv = mpi.mpirun_command(spec_of(["a"]), python="/py", mpirun="m", as_root=False, extra=extra)
    assert argv[-7:] == [*extra, "/py", "-m", "sparktrain.worker"]


def test_not_root_no_allow_flag():
    argv = mpi.mpirun_command(spec_of(["a"]), python="/py", mpirun="/mpirun", as_root=False)
    assert "--allow-run-as-root" not in argv


@pytest.mark.parametrize(
    "hosts, ifnames, expected",
    [
        (["a", "b"], ["eth0", "eth0"], "eth0"),
        (["a", "b"], ["eth0", "ens5"], None),  # no common name
        (["a", "b"], ["eth0", None], None),
        (["a", "a"], ["eth0", "eth0"], None),  # one host: shared memory, leave MPI alone
    ],
)
def test_interface_pinned_only_when_common(hosts, ifnames, expected):
    mca = _mca(mpi.mpirun_command(spec_of(hosts, ifnames), python="/py", mpirun="m", as_root=False))
    assert mca.get("btl_tcp_if_include") == expected
    assert mca.get("oob_tcp_if_include") == expected


def test_daemon_hosts_and_who_serves_them():
    spec = spec_of(["a", "b", "a", "c", "b"])
    assert mpi.hosts_needing_daemons(spec) == ["b", "c"]
    assert mpi.first_task_on(spec, "b") == 1
    assert mpi.first_task_on(spec, "c") == 3


@pytest.mark.parametrize(
    "host, expected",
    [
        ("10.0.0.2", "10.0.0.2:7001"),
        ("node-b.example.com", "10.1.1.1:1"),
        ("node-b", "10.1.1.1:1"),  # mpirun may shorten names to their first label
        ("10.0.0", None),  # addresses are never matched by prefix
        ("elsewhere", None),
    ],
)
def test_peer_for(host, expected):
    peers = {"10.0.0.2": "10.0.0.2:7001", "node-b.example.com": "10.1.1.1:1"}
    assert mpi.peer_for(host, peers) == expected


def test_rank_table_round_trip():
    table = {0: {"RANK": "0", "LOCAL_RANK": "0"}, 3: {"RANK": "3"}}
    assert contract.parse_rank_table(contract.rank_table(table)) == table


def test_backend_env_under_mpi_selects_mpi_controller():
    spec = spec_of(["a", "b"], ["eth0", "eth0"])
    config = RunConfig(np=2, backend="horovod", launcher="mpi")
    env = get_backend("horovod").env(spec, spec.ranks[1], {}, config)
    assert env["HOROVOD_CONTROLLER"] == "mpi" and env["HOROVOD_CPU_OPERATIONS"] == "mpi"
    assert not any(k.startswith("HOROVOD_GLOO") or k == "HOROVOD_RANK" for k in env)


# What mpirun --tag-output printed for two unbuffered Python ranks (captured with 4.1.4).
CHUNKED = [
    "[1,1]<stdout>:rank[1,1]<stdout>: [1,1]<stdout>:1[1,1]<stdout>: [1,1]<stdout>:ready"
    "[1,1]<stdout>:",
    "[1,0]<stdout>:rank 0 ready",
    "[1,1]<stderr>:Traceback (most recent call last):",
    "[1,1]<stderr>:    [1,1]<stderr>:raise x[1,1]<stderr>:",
    "[1,1]<stderr>: [1,1]<stderr>: [1,1]<stderr>:^[1,1]<stderr>:^[1,1]<stderr>:",
    "[1,1]<stderr>:RuntimeError[1,1]<stderr>:: [1,1]<stderr>:boom[1,1]<stderr>:",
    "--------------------------------------------------------------------------",
    "Primary job  terminated normally, but 1 process returned",
]


def test_tag_splitter_rebuilds_lines_per_rank():
    splitter = mpi.TagSplitter()
    got = [pair for line in CHUNKED for pair in splitter.feed(line)]
    assert got == [
        (1, "rank 1 ready"),
        (0, "rank 0 ready"),
        (1, "Traceback (most recent call last):"),
        (1, "    raise x"),
        (1, "  ^^"),
        (1, "RuntimeError: boom"),
        (None, "-" * 74),
        (None, "Primary job  terminated normally, but 1 process returned"),
    ]
    assert list(splitter.flush()) == []


def test_tag_splitter_interleaved_and_unfinished_lines():
    splitter = mpi.TagSplitter()
    # Rank 1 starts a line, rank 0 writes a whole one, then rank 1 finishes its own.
    assert list(splitter.feed("[1,1]<stdout>:hel[1,0]<stdout>:zero")) == [(0, "zero")]
    assert list(splitter.feed("[1,1]<stdout>:lo")) == [(1, "hello")]
    # Text before the first tag is mpirun's own, even when ranks follow on the line.
    assert list(splitter.feed("mpirun: plain[1,2]<stdout>:x")) == [
        (None, "mpirun: plain"),
        (2, "x"),
    ]
    assert list(splitter.feed("[12,3]<stddiag>:diag")) == [(3, "diag")]
    # A piece left open by a line that another rank ended comes out at the end.
    assert list(splitter.feed("[1,4]<stdout>:open[1,0]<stdout>:")) == [(0, "")]
    assert list(splitter.flush()) == [(4, "open")]


EXIT_CODE_REPORT = """
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[6524,1],1]
  Exit code:    3
--------------------------------------------------------------------------
"""
SIGNAL_REPORT = """
--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 30312 on node 127.0.0.2 exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize(
    "text, expected",
    [
        (EXIT_CODE_REPORT, {1: 3}),
        (SIGNAL_REPORT, {1: -9}),
        ("all fine\n", {}),
        ("Exit code: 4\n", {}),
    ],  # an exit code without a process name is not attributed
)
def test_parse_exits(text, expected):
    assert mpi.parse_exits(text.splitlines()) == expected
