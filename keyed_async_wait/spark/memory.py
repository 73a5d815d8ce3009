"""The peak memory one task of a worker process adds (Linux; zero elsewhere).

A Python worker runs many tasks, so its lifetime peak (``ru_maxrss``) says nothing about one
task. Linux resets a process's high-water mark when ``5`` is written to
``/proc/self/clear_refs``; the peak resident size reached since then, less the resident size at
the reset, is what the task added.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PeakMemory"]

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


class PeakMemory:
    """Reset the high-water mark now; :meth:`growth_kib` later."""

    def __init__(self) -> None:
        self.available = False
        self.start = 0
        try:
            _CLEAR.write_text("5")
            self.start = _kib("VmRSS:")
            self.available = True
        except OSError:
            pass

    def growth_kib(self) -> int:
        if not self.available:
            return 0
        try:
            return max(0, _kib("VmHWM:") - self.start)
        except OSError:
            return 0
