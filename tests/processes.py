"""Child processes that never outlive their test: each runs in a session of its own, and the
whole group (Spark's JVM, a redis-server, Python workers) is killed when the test is done
with it, also on a timeout or a failure."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group of ``proc`` (a session leader) and reap ``proc``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)


def run_bounded(args: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` with ``capture_output`` and ``text``, whose whole process group is
    killed when it times out (then TimeoutExpired is raised) or when anything goes wrong."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        kill_group(proc)
        proc.communicate()
        raise
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind in its group
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@contextlib.contextmanager
def group(args: Sequence[str], **kwargs: Any) -> Iterator[subprocess.Popen[Any]]:
    """A ``Popen`` in a session of its own; its group is killed on leaving the block."""
    proc = subprocess.Popen(args, start_new_session=True, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill_group(proc)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait (at most ``timeout`` seconds) for a process that is not our child to exit."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)
