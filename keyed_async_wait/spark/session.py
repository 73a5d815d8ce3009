"""What a wait reads from its session: the ``spark.sql.exec.async-lookup.*`` settings, the
time zone, and how many partitions a key-ordered wait spreads its keys over.

The settings belong to groups: the operator's (:data:`~keyed_async_wait.core.spec.OPERATOR_SETTINGS`)
and every group an installed package names under the ``keyed_async_wait.settings`` entry point
(the lookups' cache, rate and breaker keys, ``lookup.settings``). A key no group knows is an
error naming it and the closest known key; the operator's are read here, the others by the
backend they configure (its ``configured(settings)``, given :attr:`SessionView.raw`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ..core.config import PREFIX, SettingsGroup
from ..core.spec import OPERATOR_SETTINGS, SessionSettings
from .compat import session_settings

__all__ = [
    "SessionView",
    "key_partitions",
    "known_keys",
    "other_groups",
    "session_time_zone",
    "session_view",
    "task_slots",
]

log = logging.getLogger(__name__)

ENTRY_POINTS = "keyed_async_wait.settings"


@functools.lru_cache(maxsize=1)
def other_groups() -> tuple[SettingsGroup, ...]:
    """The settings groups installed packages add (the ``keyed_async_wait.settings`` entry points)."""
    groups = []
    for point in metadata.entry_points(group=ENTRY_POINTS):
        group = point.load()
        if not isinstance(group, SettingsGroup):
            raise TypeError(f"entry point {point.name} ({point.value}) of {ENTRY_POINTS} is no SettingsGroup")
        groups.append(group)
    if not groups:  # the package on sys.path without its metadata: every other key is unknown
        log.warning("no %s entry points: only the operator's settings are known", ENTRY_POINTS)
    return tuple(groups)


def known_keys() -> tuple[str, ...]:
    """Every ``spark.sql.exec.async-lookup.*`` key a session may set: the operator's and the
    installed groups' (e.g. to unset them all)."""
    return tuple(key for group in (OPERATOR_SETTINGS, *other_groups()) for key in group.full_keys)


@dataclass(frozen=True)
class SessionView:
    """A session's ``spark.sql.exec.async-lookup.*`` settings, checked: the operator's, and
    every one as set (for the backends that read their own)."""

    operator: SessionSettings = field(default_factory=SessionSettings)
    raw: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any], known: tuple[SettingsGroup, ...] | None = None) -> SessionView:
        """Checked against the operator's keys and ``known`` groups (default: the installed ones)."""
        groups = other_groups() if known is None else known
        given = {str(k): str(v) for k, v in raw.items() if str(k).startswith(PREFIX)}
        return cls(SessionSettings.from_conf(given.get, present=given, others=groups), given)


def session_view(spark: Any) -> SessionView:
    """The session's settings, checked (a misspelt key is an error naming the closest known one)."""
    return SessionView.of(session_settings(spark, PREFIX))


def session_time_zone(spark: Any) -> str:
    return str(spark.conf.get("spark.sql.session.timeZone"))


def task_slots(spark: Any) -> int:
    """The tasks the cluster runs at once (``defaultParallelism``: the executors' cores). A Spark
    Connect client cannot read it: there ``spark.default.parallelism`` when set, else what the
    server gives a range without partitions (its ``defaultParallelism``, or
    ``spark.sql.leafNodeDefaultParallelism`` when set), learned with one small job per session
    (again every :data:`SLOTS_TTL` seconds)."""
    context = getattr(spark, "_sc", None)  # a classic session's SparkContext (Connect has none)
    if context is not None:
        return max(1, int(context.defaultParallelism))
    return _served_slots(spark)


SLOTS_TTL = 600.0  # seconds a learned figure stands: executors that come and go are seen again
_PROBE_ROWS = 1 << 20  # more than any cluster's cores: every partition holds rows
_SERVED: dict[str, tuple[float, int]] = {}  # session id: (when learned, its server's slots)


def _served_slots(spark: Any) -> int:
    """``spark.default.parallelism`` when set, else how many partitions the Connect server splits
    a range into unasked: the partition id of the last row of a range long enough that every
    partition holds a row, plus one (a job of one stage). Learned at a session's first need
    and again after :data:`SLOTS_TTL` (each a round trip to the server at least)."""
    session = str(getattr(spark, "session_id", "") or id(spark))
    learned = _SERVED.get(session)
    if learned is None or time.monotonic() - learned[0] > SLOTS_TTL:
        given = str(spark.conf.get("spark.default.parallelism", "") or "")
        learned = (time.monotonic(), int(given) if given.isdigit() and int(given) > 0 else _ranged(spark))
        _SERVED[session] = learned
        log.debug("Spark Connect session %s: %d task slots", session, learned[1])
    return learned[1]


def _ranged(spark: Any) -> int:
    from pyspark.sql import functions

    # a range's partitions split it in order: its last row is in the last one (no shuffle)
    last = spark.range(0, _PROBE_ROWS).where(f"id = {_PROBE_ROWS - 1}")
    top = last.select(functions.spark_partition_id().alias("p")).collect()  # one job, not take's
    return max(1, int(top[0][0]) + 1) if top else 1


def key_partitions(spark: Any, num_partitions: int | None = None) -> int:
    """The partitions a key-ordered wait spreads its keys over: ``num_partitions``, else one per
    task slot, so every task that runs at once holds as many keys as it can (Flink's key groups
    over its parallelism). Spark's shuffle partitions (200 by default) would give each running
    task a two-hundredth of the keys, and so of the concurrency, on a small cluster. Rescaling is
    safe either way: every micro-batch and every query repartitions by the key again."""
    return num_partitions if num_partitions is not None else task_slots(spark)
