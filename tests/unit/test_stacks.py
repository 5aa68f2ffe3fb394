"""Reading a rank's faulthandler dump: its main thread, whether it is complete, the innermost
frame of the user's code, and the stack as people read it."""

from __future__ import annotations

import os
import sysconfig

import pytest

from sparktrain import contract, stacks
from sparktrain.stacks import Frame, Stack

SITE = os.path.join(sysconfig.get_paths()["purelib"], "torch", "distributed")
STDLIB = sysconfig.get_paths()["stdlib"]
OWN = os.path.dirname(os.path.abspath(stacks.__file__))
MAIN = 0x7F5619BBEB80

# What faulthandler writes for a rank blocked in all_reduce, with one helper thread.
DUMP = f"""\
Thread 0x00007f5618f846c0 (most recent call first):
  File "{STDLIB}/threading.py", line 324 in wait
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

Current thread 0x00007f5619bbeb80 (most recent call first):
  File "{SITE}/distributed_c10d.py", line 3252 in all_reduce
  File "{SITE}/c10d_logger.py", line 83 in wrapper
  File "/job/train.py", line 42 in step
  File "/job/train.py", line 50 in train
  File "{OWN}/worker/bootstrap.py", line 230 in main
  File "{OWN}/worker/__main__.py", line 20 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""

SOURCE = {
    ("/job/train.py", 42): "    dist.all_reduce(t)",
    ("/job/train.py", 50): "loss = step(batch)",
    (f"{SITE}/distributed_c10d.py", 3252): "work.wait()",
}


def source(path: str, line: int) -> str:
    return SOURCE.get((path, line), "")


def test_the_main_threads_frames_most_recent_first() -> None:
    stack = stacks.main_stack(DUMP, MAIN)
    assert stack is not None and not stack.truncated
    assert [f.name for f in stack.frames][:4] == ["all_reduce", "wrapper", "step", "train"]
    assert stack.frames[2] == Frame("/job/train.py", 42, "step")
    assert stacks.main_stack(DUMP, 0x1234) is None


@pytest.mark.parametrize(
    "text, complete",
    [
        (DUMP, True),
        (DUMP[: DUMP.index("_run_code") + 10], False),  # the outermost frame not written yet
        (DUMP[: DUMP.rindex("_run_module_as_main") + 5], False),  # cut inside the last line
        (DUMP[: DUMP.index("Current thread")], False),  # the main thread not reached
        # The main thread's section ends where another thread's begins.
        (DUMP.split("\n\n")[1] + "\nThread 0x00000000000000aa (most recent call first):\n", True),
        ("Current thread 0x00007f5619bbeb80 (most recent call first):\n  ...\n", True),
        (
            "Current thread 0x00007f5619bbeb80 (most recent call first):\n  <no Python frame>\n",
            True,
        ),
        ("", False),
    ],
)
def test_a_dump_is_complete_once_the_main_thread_is_written_to_its_end(
    text: str, complete: bool
) -> None:
    assert stacks.is_complete(text, MAIN, "_run_module_as_main") is complete


def test_a_later_dump_wins() -> None:
    second = DUMP.replace("line 42 in step", "line 44 in step")
    stack = stacks.main_stack(DUMP + second, MAIN)
    assert stack is not None and stack.frames[2].line == 44


@pytest.mark.parametrize(
    "path, library",
    [
        (f"{SITE}/distributed_c10d.py", True),
        ("/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", True),
        ("/usr/lib/python3/dist-packages/numpy/core.py", True),
        (f"{STDLIB}/threading.py", True),
        ("<frozen runpy>", True),
        (f"{OWN}/worker/bootstrap.py", True),
        (f"{OWN}/examples/digits.py", False),  # sparktrain's examples are user code
        ("/job/train.py", False),
        ("<string>", False),
    ],
)
def test_what_counts_as_library_code(path: str, library: bool) -> None:
    assert stacks.is_library(path) is library


def test_where_names_the_call_and_the_users_line_that_made_it() -> None:
    stack = stacks.main_stack(DUMP, MAIN)
    assert stack is not None
    assert stacks.where(stack, source) == (
        "in all_reduce (distributed_c10d.py:3252), called from step at train.py:42: "
        "dist.all_reduce(t)"
    )


def test_where_when_the_user_frame_is_innermost() -> None:
    # time.sleep is C: the innermost Python frame is the user's own.
    stack = Stack((Frame("/job/train.py", 17, "train"), Frame("<frozen runpy>", 198, "x")))
    assert stacks.where(stack, lambda p, n: "time.sleep(60)") == (
        "in train at train.py:17: time.sleep(60)"
    )
    assert stacks.where(stack, lambda p, n: "") == "in train at train.py:17"


def test_where_without_user_code_or_frames() -> None:
    stack = Stack(
        (
            Frame("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
            Frame(f"{OWN}/payload.py", 12, "load_call"),
            Frame("<frozen runpy>", 198, "_run_module_as_main"),
        )
    )
    assert stacks.where(stack, source) == "in load_call at payload.py:12"
    assert stacks.where(Stack(()), source) == "in no Python code"


def test_render_reads_like_a_traceback_from_the_users_outermost_frame() -> None:
    stack = stacks.main_stack(DUMP, MAIN)
    assert stack is not None
    assert stacks.render(stack, source).splitlines() == [
        '  File "/job/train.py", line 50, in train',
        "    loss = step(batch)",
        '  File "/job/train.py", line 42, in step',
        "    dist.all_reduce(t)",
        f'  File "{SITE}/c10d_logger.py", line 83, in wrapper',
        f'  File "{SITE}/distributed_c10d.py", line 3252, in all_reduce',
        "    work.wait()",
    ]


def test_render_leaves_out_the_import_machinery_and_marks_a_cut_stack() -> None:
    stack = Stack(
        (
            Frame("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
            Frame("/job/train.py", 3, "<module>"),
        ),
        truncated=True,
    )
    assert stacks.render(stack, source).splitlines() == [
        "  ... (outer frames not shown)",
        '  File "/job/train.py", line 3, in <module>',
    ]


def test_the_stack_header_round_trips() -> None:
    line = contract.stack_header(MAIN, "_run_module_as_main")
    assert line.endswith("\n")
    assert contract.parse_stack_header(line) == (MAIN, "_run_module_as_main")
    for other in ("", "hello", "sparktrain-stacks main=zz root=x", "sparktrain-stacks root=x"):
        assert contract.parse_stack_header(other) is None
