"""Parked rows as keyed state under ``<checkpoint>/async_state/``: versioned, verified, written
incrementally. The rows are read and written through DataFrames, the small files (layout,
manifests) as :mod:`~keyed_async_wait.spark.small_files` says (any filesystem Spark supports,
either way), and nothing is ever deleted except by overwriting a slot that no
version still needed refers to.

Layout (``S = window + keep`` slots, a micro-batch ``n`` uses slot ``n % S``):

- ``init/``: when the state began (the first micro-batch), its format, window and keep.
- ``seg/<slot>/``: parquet, the rows micro-batch ``n`` parked: rows it ran that did not finish,
  new rows of keys that stayed parked, and rows of older segments compacted into it.
- ``rm/<slot>/``: parquet, the keys micro-batch ``n`` took out of the older segments (it
  replayed them); a row of segment ``f`` is live unless its key is in a removal ``k > f``.
- ``manifest/<slot>/``: the version ``n`` itself (JSON), written last: which segments and
  removals make it up, their row counts, their files and the files' sizes; on Spark Connect
  also micro-batch ``n``'s report, for the client (in the one file: on Connect each small file
  is a Spark job of its own). Earlier releases wrote the report in ``report/<slot>/``.

Invariants. Micro-batch ``n`` reads version ``n - 1`` and only that: it is the one the last
committed micro-batch wrote (Spark runs ``n`` only once ``n - 1`` committed, and re-runs ``n``
after a crash). A version refers to segments and removals of the last ``window`` micro-batches
only (older segments are compacted into the new one), so writing slot ``n % S`` overwrites
micro-batch ``n - S``'s files, which no version of the last ``keep`` refers to; with ``keep``
at least 2, a crash between writing version ``n`` and Spark's commit of ``n`` finds version
``n - 1`` whole. At the first micro-batch of every run the version read is verified: its
manifest names the right micro-batch, and every file it lists is there with its size; its row
count is checked again whenever it is read. Anything else is a :class:`StateError` naming the
path and the micro-batch, before any lookup or sink call: never a silent fallback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..core.exceptions import ConfigError, StateError
from .key_hash import placement_columns
from .metrics import is_connect
from .parts import Part, read_parts, write_part
from .small_files import committed_batches, driver_disk_folder, file_sizes, read_text, write_text

__all__ = ["FORMAT", "ParkedStore", "Part", "StateError", "Version", "joined_by_key"]

FORMAT = 2
MIN_KEEP = 2
DEFAULT_WINDOW = 16


@dataclass(frozen=True)
class Version:
    batch: int
    rows: int  # live parked rows
    segments: tuple[Part, ...] = ()
    removals: tuple[Part, ...] = ()
    format: int = FORMAT

    @property
    def latest_try(self) -> float | None:
        """The latest next_try of any row (None: every row is due now)."""
        tries = [p.latest_try for p in self.segments if p.latest_try is not None]
        return max(tries) if tries else None

    @property
    def earliest_try(self) -> float | None:
        """The earliest next_try of any row (None: some row is due now)."""
        tries = [p.earliest_try for p in self.segments]
        return None if not tries or None in tries else min(t for t in tries if t is not None)

    def to_json(self, report: dict[str, Any] | None = None) -> str:
        data = asdict(self) if report is None else {**asdict(self), "report": report}
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Version:
        data = json.loads(text)
        parts = {
            name: tuple(
                Part(
                    p["batch"],
                    p["rows"],
                    tuple(map(tuple, p["files"])),
                    p["fresh"],
                    p["latest_try"],
                    p["earliest_try"],
                    p.get("sized", False),
                )
                for p in data[name]
            )
            for name in ("segments", "removals")
        }
        return cls(data["batch"], data["rows"], parts["segments"], parts["removals"], data["format"])


@dataclass(frozen=True)
class Layout:
    first_batch: int
    window: int
    keep: int
    heartbeat: bool = False  # the query has the heartbeat source (Spark fixes a query's sources)
    format: int = FORMAT

    @property
    def slots(self) -> int:
        return self.window + self.keep


@dataclass
class ParkedStore:
    spark: SparkSession
    checkpoint: str  # the query's checkpoint location
    keep: int = 3
    window: int = DEFAULT_WINDOW
    heartbeat: bool = False
    layout: Layout | None = field(default=None, init=False)
    _last: Version | None = field(default=None, init=False)  # the version this run wrote last
    # where the small files' folders are (driver's disk or not): the root's, resolved once
    _folders: dict[str, Path | None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.checkpoint = self.checkpoint.rstrip("/")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < MIN_KEEP:
            raise ConfigError(
                "keep_versions",
                self.keep,
                f"an integer >= {MIN_KEEP}: writing version n replaces version n - keep, and with 1 a "
                "crash between writing version n and Spark's commit of micro-batch n would leave no "
                "version to re-run from",
            )
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ConfigError("state window", self.window, "an integer >= 1")

    # ------------------------------------------------------------------ paths

    @property
    def root(self) -> str:
        return f"{self.checkpoint}/async_state"

    def _known(self) -> dict[str, Path | None]:
        """Where the small files' folders are: the root's place, asked of Hadoop once (every
        folder under it is on the same filesystem)."""
        if self.root not in self._folders and not is_connect(self.spark):
            driver_disk_folder(self.spark, self.root, self._folders)
        return self._folders

    def path(self, kind: str, batch: int) -> str:
        assert self.layout is not None
        return f"{self.root}/{kind}/{batch % self.layout.slots:04d}"

    # ------------------------------------------------------------------ opening

    def open(self, batch_id: int) -> Version | None:
        """The version micro-batch ``batch_id`` starts from (None: no parked state yet),
        verified at the first call of a run."""
        if self._last is not None and self._last.batch == batch_id - 1:
            return self._last  # written by this run: verified as it was written
        if self.layout is None:
            self.layout = self._read_layout(batch_id)
        layout = self.layout
        if batch_id < layout.first_batch:
            raise StateError(
                f"the state begins at micro-batch {layout.first_batch}, the query is at {batch_id}",
                path=self.root,
                batch_id=batch_id,
            )
        if batch_id == layout.first_batch:
            return None
        version = self._read_version(batch_id - 1)
        self._verify(version)
        return version

    def _read_layout(self, batch_id: int) -> Layout:
        text = read_text(self.spark, f"{self.root}/init")
        if text is None:
            committed = committed_batches(self.spark, self.checkpoint)
            earlier = [b for b in committed if b < batch_id]
            if earlier:
                raise StateError(
                    f"the query committed micro-batches up to {max(earlier)} but there is no parked state "
                    "(async_state/init is missing): its parked rows are gone",
                    path=f"{self.root}/init",
                    batch_id=batch_id,
                )
            layout = Layout(batch_id, self.window, self.keep, self.heartbeat)
            write_text(self.spark, f"{self.root}/init", json.dumps(asdict(layout)), known=self._known())
            return layout
        data = json.loads(text)
        layout = Layout(**data)
        if layout.format != FORMAT:
            raise StateError(
                f"format {layout.format}; this version reads {FORMAT}", path=self.root, batch_id=None
            )
        if (layout.keep, layout.window) != (self.keep, self.window):
            raise ConfigError(
                "keep_versions",
                self.keep,
                f"{layout.keep}, what this checkpoint's state was made with (its layout is fixed)",
            )
        return layout

    def check_query(self) -> None:
        """Before a query starts: its shape must be the one the checkpoint began with (Spark
        fails a query whose sources differ from its checkpoint's, with a message that does not
        say why)."""
        text = read_text(self.spark, f"{self.root}/init")
        if text is None:
            return
        began = Layout(**json.loads(text))
        if began.heartbeat != self.heartbeat:
            allowed = "a heartbeat, as" if began.heartbeat else "no heartbeat, as"
            raise ConfigError(
                "heartbeat",
                "set" if self.heartbeat else None,
                f"{allowed} when this checkpoint began (the heartbeat is a source of the query, and "
                "Spark fixes a query's sources in its checkpoint): use another checkpoint to change it",
            )

    def _read_version(self, batch: int) -> Version:
        path = self.path("manifest", batch)
        text = read_text(self.spark, path)
        if text is None:
            raise StateError(f"version {batch} is missing (no manifest)", path=path, batch_id=batch + 1)
        try:
            version = Version.from_json(text)
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"the manifest is damaged ({exc})", path=path, batch_id=batch + 1) from exc
        if version.batch != batch:
            raise StateError(
                f"the manifest is of micro-batch {version.batch}, not of {batch}: version {batch} is missing",
                path=path,
                batch_id=batch + 1,
            )
        return version

    def _verify(self, version: Version) -> None:
        """Every file the version lists is there, readable, with its rows (its size, for a
        part written with its sizes, whose rows are checked per part)."""
        parts = [("seg", p) for p in version.segments] + [("rm", p) for p in version.removals]
        if not parts:
            return
        try:
            found = self._stats([(kind, part.batch) for kind, part in parts], version.batch)
        except Exception as exc:
            raise StateError(
                f"version {version.batch} cannot be read ({type(exc).__name__}: {str(exc)[:300]})",
                path=self.root,
                batch_id=version.batch + 1,
            ) from exc
        for kind, part in parts:
            path = self.path(kind, part.batch)
            read = found.get((kind, part.batch))
            have = dict(read.files) if read is not None else {}
            where = f"version {version.batch}"
            if part.sized:  # its files' sizes; its rows as a whole, below
                have = dict(file_sizes(self.spark, path))
            unit = "bytes" if part.sized else "rows"
            for name, count in part.files:
                if name not in have:
                    _damaged(version, path, f"{name} of {where} is missing")
                if have[name] != count:
                    _damaged(
                        version, path, f"{name} of {where} holds {have[name]} {unit}, not the {count} written"
                    )
            if part.sized and read is not None and read.rows != part.rows:
                _damaged(
                    version, path, f"{kind} {part.batch} of {where} holds {read.rows} rows, not {part.rows}"
                )

    # ------------------------------------------------------------------ reading

    def live(
        self,
        version: Version,
        schema: StructType,
        keys: Sequence[str],
        partitions: int,
        only: Sequence[int] | None = None,
    ) -> DataFrame | None:
        """The live parked rows of ``version`` (of its segments ``only``, when given; None
        when there are none), hash-partitioned by ``keys`` into ``partitions``.

        The partitioning is explicit so that every step over the state (the removal join, the
        per-key summary, the joins with a micro-batch's keys, the parts written) runs at the
        lookups' partition count rather than ``spark.sql.shuffle.partitions`` (200 by default:
        200 tasks a step, 200 files a part, a cached summary Spark cannot coalesce)."""
        segments = [p for p in version.segments if only is None or p.batch in only]
        if not version.rows or not segments:
            return None
        # one scan over every segment (and one over every removal set), each row tagged with
        # the micro-batch that wrote it, found from its file's slot: a union of one scan per
        # part made a plan, code-generated afresh each micro-batch, that grew with the window
        placed = placement_columns(schema, list(keys))
        rows = self._scan("seg", segments, "_kaw_file", spark_schema=schema).repartition(partitions, *placed)
        if version.removals:
            removed = (
                self._scan("rm", version.removals, "_kaw_removed")
                .select(*keys, "_kaw_removed")
                .repartition(partitions, *placed)
            )
            # plain equality (a parked key is never NULL: the worker refuses NULL keys, and a row
            # parks behind a key only by an equality join), so the join keeps the partitioning
            condition = [rows[k] == removed[k] for k in keys] + [removed["_kaw_removed"] > rows["_kaw_file"]]
            rows = rows.join(joined_by_key(removed), on=condition, how="left_anti")
        return rows.drop("_kaw_file")

    def _scan(
        self, kind: str, parts: Sequence[Part], tag: str, spark_schema: StructType | None = None
    ) -> DataFrame:
        """The rows of ``parts`` (of ``kind``) in one parquet scan, ``tag`` the micro-batch
        each part holds (a part's directory is its slot: ``batch % slots``)."""
        assert self.layout is not None
        reader = self.spark.read if spark_schema is None else self.spark.read.schema(spark_schema)
        df = reader.parquet(*(self.path(kind, part.batch) for part in parts))
        slot = F.regexp_extract(F.input_file_name(), rf"/{kind}/(\d+)/[^/]+$", 1).cast("int")
        batches = F.create_map(
            *(F.lit(x) for part in parts for x in (part.batch % self.layout.slots, part.batch))
        )
        return df.withColumn(tag, batches[slot].cast("long"))

    # ------------------------------------------------------------------ writing

    def write(self, kind: str, df: DataFrame, batch_id: int) -> Part | None:
        """Write micro-batch ``batch_id``'s segment (``"seg"``) or removal set (``"rm"``); its
        part as :func:`~keyed_async_wait.spark.parts.write_part` counted it."""
        return write_part(self.spark, kind, df, self.path(kind, batch_id), batch_id)

    def _stats(self, parts: Sequence[tuple[str, int]], batch_id: int) -> dict[tuple[str, int], Part]:
        return read_parts(
            self.spark, {(kind, batch): self.path(kind, batch) for kind, batch in parts}, batch_id
        )

    def commit(
        self,
        batch_id: int,
        previous: Version | None,
        written: Mapping[str, Part | None],
        replayed: int,
        all_replayed: bool,
        note: Callable[[Version], dict[str, Any]] | None = None,
    ) -> Version:
        """Version ``batch_id``, from ``previous``, the parts written (``"seg"``, ``"rm"``: as
        :meth:`write` returned them) and the rows replayed (``all_replayed``: every key of
        ``previous`` was); its manifest written last, with ``note(version)`` as its report when
        given (readers of a version ignore it)."""
        assert self.layout is not None
        parts = {(kind, batch_id): part for kind, part in written.items() if part is not None}
        unread = [(kind, batch_id) for kind, part in written.items() if part is None]
        if unread:
            parts.update(self._stats(unread, batch_id))
        segment, removal = parts.get(("seg", batch_id)), parts.get(("rm", batch_id))
        segments, removals = ([], []) if all_replayed else self._kept(batch_id, previous)
        if segment is not None and segment.rows:
            segments.append(segment)
        if removal is not None and removal.rows and segments:
            removals.append(removal)
        oldest = min((p.batch for p in segments), default=batch_id)
        removals = [r for r in removals if r.batch > oldest]
        fresh = segment.fresh if segment is not None else 0
        rows = (previous.rows if previous is not None else 0) - replayed + fresh
        version = Version(batch_id, rows, tuple(segments), tuple(removals))
        text = version.to_json() if note is None else version.to_json(report=note(version))
        write_text(self.spark, self.path("manifest", batch_id), text, known=self._known())
        self._last = version
        return version

    # ------------------------------------------------------------------ reports

    def published(self) -> list[str]:
        """The reports the manifests in every slot carry (JSON, one each; empty when none do)."""
        text = read_text(self.spark, f"{self.root}/manifest/*")
        found = [json.loads(line).get("report") for line in (text.splitlines() if text else [])]
        return [json.dumps(report, sort_keys=True) for report in found if report is not None]

    def _kept(self, batch_id: int, previous: Version | None) -> tuple[list[Part], list[Part]]:
        """The previous version's segments still in the window, and its removals."""
        if previous is None:
            return [], []
        aged = set(self.aged(batch_id, previous))
        return [p for p in previous.segments if p.batch not in aged], list(previous.removals)

    def aged(self, batch_id: int, previous: Version | None) -> list[int]:
        """The segments micro-batch ``batch_id`` must compact into its own (out of the window)."""
        if previous is None:
            return []
        assert self.layout is not None
        horizon = batch_id - self.layout.window
        return [p.batch for p in previous.segments if p.batch <= horizon]


def joined_by_key(side: DataFrame) -> DataFrame:
    """``side`` as the build side of a join of two DataFrames hash-partitioned alike by key: a
    hash table per task, its memory freed (and pooled for the next task) when the task ends.

    Left to Spark, a small side is broadcast instead: its hash table then takes a memory page
    (32 MB at a 1 GB heap), a "humongous" object for G1, held until Spark's cleaner finds the
    broadcast unused after a collection. A long stream with parked rows makes several a
    micro-batch (measured: 74 pages, 2.4 GB, a minute), which is much of what its driver's GC
    collects."""
    return side.hint("shuffle_hash")


def _damaged(version: Version, path: str, message: str) -> NoReturn:
    raise StateError(message, path=path, batch_id=version.batch + 1)
