"""CPU seconds of a process tree, read from /proc with nothing but the standard library.

Shared by every engine's job script in ``benchmarks/peers/`` (each runs in its own virtual
environment, so this module needs no package). A process's figure is its own user + system
time and that of the children it reaped (``cutime``/``cstime``): a worker that exited during a
job still counts, through the parent that waited for it. :func:`adopt_orphans` makes this
process a subreaper, so that a grandchild whose parent died without waiting (a daemon's
double fork) stays in the tree instead of leaving it for init.
"""

from __future__ import annotations

import ctypes
import os
from collections import defaultdict
from collections.abc import Callable

TICK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Make this process the reaper of its tree's orphans (Linux 3.4+)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _stat(pid: int) -> tuple[int, str, float] | None:
    """(parent pid, command name, CPU seconds incl. reaped children) of ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return int(fields[1]), name, (utime + stime + cutime + cstime) / TICK


def own_times() -> dict[int, tuple[int, float]]:
    """{pid: (parent pid, CPU seconds of the process itself)} of every process on the machine.

    Without the reaped children's time: a process whose parent ignores SIGCHLD (Spark's Python
    daemon does, for its workers) is reaped by the kernel and its time reaches no parent, so a
    meter that must not lose it samples the processes themselves while they live."""
    out: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                raw = handle.read().decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tree(root: int | None = None) -> dict[int, tuple[str, float]]:
    """{pid: (command line, CPU seconds)} of ``root`` (this process) and its live descendants."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = defaultdict(list)
    stats: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        found = _stat(int(entry))
        if found is not None:
            parent, name, seconds = found
            children[parent].append(int(entry))
            stats[int(entry)] = (name, seconds)
    out: dict[int, tuple[str, float]] = {}
    todo = [root]
    while todo:  # bounded: each pid is met once (a tree)
        pid = todo.pop()
        if pid in stats and pid not in out:
            out[pid] = (_cmdline(pid) or stats[pid][0], stats[pid][1])
            todo.extend(children[pid])
    return out


Classify = Callable[[int, str], str]


def by_part(snapshot: dict[int, tuple[str, float]], classify: Classify) -> dict[str, float]:
    """CPU seconds summed by the part ``classify(pid, command line)`` names."""
    parts: dict[str, float] = defaultdict(float)
    for pid, (cmdline, seconds) in snapshot.items():
        parts[classify(pid, cmdline)] += seconds
    return dict(parts)


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds by part between two :func:`by_part` readings."""
    return {part: after.get(part, 0.0) - before.get(part, 0.0) for part in set(before) | set(after)}
