"""The ``sparktrain`` command: parsing, TARGET forms, exit codes, doctor, and real local runs."""

from __future__ import annotations

import importlib.machinery
import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparktrain.commands import cli, cli_target, doctor, doctor_probes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "fixtures" / "cli_script.py"


# -- parsing ------------------------------------------------------------------------------


def test_parse_run_options_and_args_after_double_dash():
    options, args = cli.parse(
        [
            "run",
            "--np",
            "2",
            "--backend",
            "horovod",
            "--master",
            "local-cluster[2,1,1024]",
            "--timeout",
            "5m",
            "--conf",
            "spark.a=1",
            "train.py",
            "--",
            "--lr",
            "0.1",
            "--",
            "x",
        ]
    )
    assert (options.command, options.np, options.backend) == ("run", 2, "horovod")
    assert options.master == "local-cluster[2,1,1024]" and options.timeout == "5m"
    assert options.conf == ["spark.a=1"] and options.target == "train.py"
    assert args == ["--lr", "0.1", "--", "x"]  # only the first -- splits


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "train.py"], "--np"),  # --np is required
        (["run", "--np", "two", "train.py"], "is not N (ranks on Spark executors)"),
        (["run", "--np", "2-4", "train.py"], "MIN:MAX"),
        (["run", "--np", "2", "--backend", "mpi", "train.py"], "invalid choice"),
        (["run", "--np", "2", "train.py", "extra"], "go after `--`"),
        (["run", "--np", "0", str(SCRIPT)], "np must be a non-zero integer"),
        (["run", "--np", "-1", "--timeout", "soon", str(SCRIPT)], "not a duration"),
        (["run", "--np", "-1", "--master", "local[2]", str(SCRIPT)], "for Spark runs"),
        (["run", "--np", "2", "--conf", "novalue", str(SCRIPT)], "KEY=VALUE"),
        (["run", "--np", "-1", "missing_script.py"], "script 'missing_script.py' not found"),
        (["run", "--np", "-1", "no_colon_here"], "neither a .py script nor module:function"),
        (["run", "--np", "-1", "no_such_module_xyz:main"], "module 'no_such_module_xyz' not"),
        (["run", "--np", "-1", "os.path:no_such_function"], "has no attribute"),
        (["run", "--np", "-1", "os:sep"], "is not callable"),
        (["run", "--np", "-1", "os:getcwd", "--", "a"], "takes no arguments"),
        (["doctor", "--", "x"], "takes no ARGS"),
        (["install-horovod", "--", "x"], "takes no ARGS"),
        ([], "COMMAND"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert cli.main(["run", "--help"]) == 0
    assert "module:function" in capsys.readouterr().out


def test_install_horovod_runs_the_packaged_recipe_with_the_named_python(tmp_path, capfd):
    """The recipe ships inside the package (pip users have no scripts/ folder)."""
    script = cli.install_horovod_script()
    assert script.is_file() and script.parent == Path(cli.__file__).parent
    missing = tmp_path / "no-python-here"
    assert cli.main(["install-horovod", "--python", str(missing)]) == 2
    err = capfd.readouterr().err
    assert f"no Python interpreter at '{missing}'" in err
    assert "sparktrain install-horovod --python PATH" in err


# -- TARGET forms -------------------------------------------------------------------------


def test_script_target_ships_its_source():
    fn, args = cli.resolve_target(str(SCRIPT), ["--flag", "x"])
    assert fn is cli_target.run_script
    assert args == [str(SCRIPT), SCRIPT.read_text(), ["--flag", "x"]]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module in the current directory, as users run `sparktrain run mymod:main`."""
    (tmp_path / "cli_user_mod.py").write_text(
        textwrap.dedent("""
        def no_args():
            return "no args"

        def main(argv):
            return ["main"] + argv

        def with_default(lr=0.1):
            return lr

        class Trainer:
            @staticmethod
            def fit(argv):
                return len(argv)
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "cli_user_mod"
    sys.modules.pop("cli_user_mod", None)


@pytest.mark.parametrize(
    "target, args, expected",
    [
        ("no_args", [], []),  # called as fn()
        ("main", [], [[]]),  # first parameter has no default: fn([])
        ("main", ["a", "b"], [["a", "b"]]),  # ARGS as one list
        ("with_default", [], []),  # a default: left alone without ARGS
        ("with_default", ["x"], [["x"]]),
        ("Trainer.fit", ["x"], [["x"]]),
    ],
)
def test_function_target_call_rule(user_module, target, args, expected):
    fn, fn_args = cli.resolve_target(f"{user_module}:{target}", args)
    assert fn_args == expected
    assert fn.__name__ == target.split(".")[-1]


def test_user_module_is_shipped_by_value(user_module):
    import cloudpickle

    fn, _ = cli.resolve_target(f"{user_module}:main", [])
    sys.modules.pop(user_module)  # executors do not have it
    clone = cloudpickle.loads(cloudpickle.dumps(fn))
    assert clone(["z"]) == ["main", "z"]


def test_run_script_runs_the_file_where_it_is_present(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint(__name__, sys.argv, __file__)\n")
    cli_target.run_script(str(script), script.read_text(), ["--a", "1"])
    assert capsys.readouterr().out == f"__main__ {[str(script), '--a', '1']} {script}\n"


def test_run_script_runs_a_copy_where_the_path_is_absent(tmp_path, capsys):
    import traceback

    source = "import sys\nprint(__name__, sys.argv[1:])\nraise ValueError('from the copy')\n"
    missing = tmp_path / "elsewhere" / "job.py"
    with pytest.raises(ValueError) as info:
        cli_target.run_script(str(missing), source, ["--a", "1"])
    assert capsys.readouterr().out == "__main__ ['--a', '1']\n"
    rendered = "".join(traceback.format_exception(info.value))
    assert "job.py" in rendered and "raise ValueError('from the copy')" in rendered
    assert not missing.exists()


def test_function_run_in_process_prints_rank0_value(user_module, capsys):
    assert cli.main(["run", "--np", "-1", f"{user_module}:main", "--", "x"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "['main', 'x']"


# -- doctor -------------------------------------------------------------------------------


def fake_probes(
    monkeypatch, *, java='openjdk version "17.0.15" 2025-04-15', torch=True, gpus="", horovod=True
):
    """Replace doctor's two ways of looking outside (programs, subprocess Python)."""

    def command(argv, timeout=0, env=None):
        name = os.path.basename(argv[0])
        if name == "java":
            return None if java is None else doctor_probes.Output(0, java)
        if name == "nvidia-smi":
            return doctor_probes.Output(0, gpus) if gpus else None
        if name == "mpirun":
            return doctor_probes.Output(0, "mpirun (Open MPI) 4.1.4\n")
        raise AssertionError(argv)

    def python_json(code, timeout=0, python=None, env=None):
        if "import json, torch" in code:
            if not torch:
                return None, "ImportError: libtorch_cpu.so: cannot open shared object file"
            return {
                "version": "2.13.0+cpu",
                "cuda": None,
                "available": False,
                "devices": [],
                "gloo": True,
                "nccl": False,
            }, ""
        if "horovod" in code:
            return (
                {"version": "0.28.1", "gloo": True, "mpi": False, "nccl": False}
                if horovod
                else None
            ), "Segmentation fault"
        if "import json, sparktrain" in code:
            return {"ok": True}, ""
        raise AssertionError(code)

    monkeypatch.setattr(doctor_probes, "_command", command)
    monkeypatch.setattr(doctor_probes, "_python_json", python_json)
    # Horovod is installed in this world (whether it imports is python_json's answer above),
    # whether or not it is in the environment running the tests.
    find_spec = doctor_probes.importlib.util.find_spec
    monkeypatch.setattr(
        doctor_probes.importlib.util,
        "find_spec",
        lambda name, *rest: (
            importlib.machinery.ModuleSpec(
                "horovod",
                importlib.machinery.SourceFileLoader(
                    "horovod", "/site-packages/horovod/__init__.py"
                ),
            )
            if name == "horovod"
            else find_spec(name, *rest)
        ),
    )
    monkeypatch.setattr(
        doctor_probes.shutil, "which", lambda name: None if name == "mpirun" else f"/usr/bin/{name}"
    )
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setattr(doctor_probes, "spark_defaults", lambda: ({}, None))


def run_doctor(*argv):
    out = io.StringIO()
    code = doctor.main(spark="--spark" in argv, stream=out)
    return code, out.getvalue()


def rows(text):
    """{name: (mark, rest)} of the table."""
    table = {}
    for line in text.splitlines():
        # names have at most one space; at least two pad them from the detail
        match = re.match(r"^\s+([✓✗!-]) (\S+(?: \S+)?)\s{2,}(.*)$", line)
        if match:
            table[match.group(2)] = (match.group(1), match.group(3))
    return table


def test_doctor_all_fine(monkeypatch):
    fake_probes(monkeypatch)
    code, text = run_doctor()
    table = rows(text)
    assert code == 0
    assert table["python"][0] == "✓" and table["torch"][0] == "✓"
    assert "17.0.15" in table["java"][1] and table["java"][0] == "✓"
    assert table["horovod"] == ("✓", "0.28.1 (gloo yes, mpi no, nccl no)")
    assert table["mpirun"][0] == "-" and table["gpus"][0] == "-"
    assert table["spark session"][0] == "-"  # not tried without --spark
    assert table["executor python"][0] == "✓"
    assert "essentials (python, torch) are fine" in text


def test_doctor_shows_fixes_and_fails_without_torch(monkeypatch):
    fake_probes(
        monkeypatch,
        java=None,
        torch=False,
        horovod=False,
        gpus="GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n",
    )
    code, text = run_doctor()
    table = rows(text)
    assert code == 1
    assert table["torch"][0] == "✗" and "libtorch_cpu.so" in table["torch"][1]
    assert table["java"][0] == "✗" and "openjdk-17-jre-headless" in text
    assert table["horovod"][0] == "✗" and "Segmentation fault" in table["horovod"][1]
    assert table["gpus"] == ("✓", "1: GPU 0: NVIDIA H100 80GB HBM3")
    assert "spark.executor.resource.gpu.amount" in text  # GPUs here, Spark not told
    assert "missing essentials: torch" in text


@pytest.mark.parametrize(
    "text, major",
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_292"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("garbage", None),
    ],
)
def test_java_version_parsing(text, major):
    assert doctor_probes._java_major(text) == major


def test_doctor_reads_spark_gpu_settings(tmp_path, monkeypatch):
    script = tmp_path / "gpus.sh"
    script.write_text("#!/bin/sh\n")
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\nspark.executor.resource.gpu.amount  1\n"
        f"spark.executor.resource.gpu.discoveryScript={script}\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    conf, where = doctor_probes.spark_defaults()
    assert conf["spark.executor.resource.gpu.amount"] == "1"
    [check] = doctor_probes.check_spark_gpus(["GPU 0"], "4.3.0", conf, where)
    assert check.status == doctor.FAIL and "not executable" in check.detail
    script.chmod(0o755)
    [check] = doctor_probes.check_spark_gpus(["GPU 0"], "4.3.0", conf, where)
    assert check.status == doctor.OK


# -- real runs in a subprocess (np < 0: no Spark) -----------------------------------------


def sparktrain_command(*argv):
    return subprocess.run(
        [sys.executable, "-m", "sparktrain", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_run_script_on_two_local_ranks():
    done = sparktrain_command("run", "--np", "-2", str(SCRIPT), "--", "--flag", "x")
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert (
            f"[rank {rank}] cli_script rank {rank}/2 sum=3 argv=['--flag', 'x'] name=__main__"
        ) in done.stdout


def test_failing_script_exits_1_with_traceback(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def explode():\n    raise ValueError('boom from the script')\n\nexplode()\n")
    done = sparktrain_command("run", "--np", "-1", str(script))
    assert done.returncode == 1
    assert "rank(s) failed" in done.stderr and "Traceback" in done.stderr
    assert "ValueError: boom from the script" in done.stderr and "explode()" in done.stderr
    assert "runpy" not in done.stderr  # the traceback starts in the script


def test_spark_that_cannot_start_is_a_usage_error(monkeypatch, capsys):
    def no_java(*args):
        raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited\nmore")

    monkeypatch.setattr(cli, "_spark_session", no_java)
    assert cli.main(["run", "--np", "2", str(SCRIPT)]) == 2
    err = capsys.readouterr().err
    assert "could not start Spark (master default): [JAVA_GATEWAY_EXITED]" in err
    assert "sparktrain doctor --spark" in err
