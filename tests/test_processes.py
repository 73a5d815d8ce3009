"""The bounded child processes the tests run: a child that outlives its bound is killed with
all it started, and the failure says where each of its Python threads stood."""

from __future__ import annotations

import sys

import pytest

from .processes import TimedOut, run_bounded, wait_exit

STUCK = """
import os, sys, threading
def held_by_a_lock_nobody_releases(lock):
    lock.acquire()
lock = threading.Lock()
lock.acquire()
worker = threading.Thread(target=held_by_a_lock_nobody_releases, args=(lock,), daemon=True)
worker.start()
child = os.fork()
if child == 0:
    os.close(1)
    os.close(2)
    threading.Event().wait()
print("started", os.getpid(), child, flush=True)
worker.join()
"""


def test_a_child_past_its_bound_is_killed_with_its_group_and_its_stacks_are_shown() -> None:
    with pytest.raises(TimedOut) as caught:
        run_bounded([sys.executable, "-c", STUCK], timeout=5)
    message = str(caught.value)
    assert "held_by_a_lock_nobody_releases" in message  # the stuck thread's stack
    pids = [int(pid) for pid in caught.value.stdout.split("started", 1)[1].split()[:2]]
    assert [pid for pid in pids if not wait_exit(pid, 10)] == []  # SIGKILL lands as they run


def test_a_child_that_ends_in_time_gives_its_output_and_exit_status() -> None:
    done = run_bounded([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=60)
    assert (done.returncode, done.stdout.strip()) == (3, "out")
