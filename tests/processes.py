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


class TimedOut(subprocess.TimeoutExpired):
    """A bounded child that did not end in time, with what it printed (its Python threads'
    stacks among it) in the message."""

    def __str__(self) -> str:
        return (
            f"{super().__str__()}\n--- its stdout, last lines:\n{_tail(self.stdout, 2000)}"
            f"\n--- its stderr, last lines:\n{_tail(self.stderr, 6000)}"
        )


def _tail(text: str | None, chars: int) -> str:
    return (text or "")[-chars:]  # run_bounded's child runs in text mode


def _stacks_then_kill(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGABRT the child, whose faulthandler then prints every Python thread's stack, and
    kill its group once it has ended or after 20 s; returns all it printed."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=20)  # the JVM it started may hold the pipes open
    kill_group(proc)
    return proc.communicate()


def run_bounded(args: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` with ``capture_output`` and ``text``, whose whole process group is
    killed when it times out or when anything goes wrong. On a timeout :class:`TimedOut` is
    raised with the child's output, in which a Python child (run with ``PYTHONFAULTHANDLER``)
    has printed where each of its threads stood."""
    env = {**(kwargs.pop("env", None) or os.environ), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
        **kwargs,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stacks_then_kill(proc)
        raise TimedOut(proc.args, timeout, stdout, stderr) from None
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
