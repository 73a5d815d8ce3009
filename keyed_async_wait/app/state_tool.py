"""``kaw-state``: look at, and get out of, damaged parked state of ``key_ordered_stream``.

    kaw-state verify CHECKPOINT                 what the next micro-batch would read, and whether it is whole
    kaw-state rewind CHECKPOINT --to N [--yes]  re-run micro-batches N+1.. from the source (exactly-once kept)
    kaw-state accept-loss CHECKPOINT [--yes]    go on without the parked rows of the damaged version

Without ``--yes`` the acting commands only say what they would do and what it costs. The query
must be stopped. The tool starts a local Spark session to reach the checkpoint's filesystem.

``rewind`` is the way out that keeps every row: it removes Spark's offset and commit entries
(and the file sources' entries) after micro-batch N, so the query plans N+1 anew and reads its
input from the source again, and starts from version N of the parked state, which must be whole.
It costs the lookups of those micro-batches again, needs the source to still hold their input
(Kafka retention, files not cleaned up), and an idempotent sink (one that overwrites per batch
id) to keep the output exactly-once. ``accept-loss`` replaces the damaged version by an empty
one: the rows it held never reach the sink (later rows of their keys do).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["main", "run"]


@dataclass
class _Checkpoint:
    spark: Any
    location: str

    def __post_init__(self) -> None:
        jvm = self.spark.sparkContext._jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        root = self._path(self.location)
        self.fs = root.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())

    def names(self, folder: str) -> list[str]:
        path = self._path(f"{self.location}/{folder}")
        if not self.fs.exists(path):
            return []
        return sorted(status.getPath().getName() for status in self.fs.listStatus(path))

    def batches(self, folder: str) -> list[int]:
        return sorted(int(name) for name in self.names(folder) if name.isdigit())

    def delete(self, relative: str) -> None:
        self.fs.delete(self._path(f"{self.location}/{relative}"), True)


def _session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("kaw-state")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _store(spark: Any, location: str) -> Any:
    import json

    from ..spark.small_files import read_text
    from ..spark.state import Layout, ParkedStore

    text = read_text(spark, f"{location.rstrip('/')}/async_state/init")
    if text is None:
        raise SystemExit(f"no parked state under {location}/async_state (no init): nothing to do")
    layout = Layout(**json.loads(text))
    store = ParkedStore(spark, location, keep=layout.keep, window=layout.window)
    store.layout = layout
    return store


def _check(store: Any, batch: int) -> tuple[Any, str | None]:
    """(the version of micro-batch ``batch`` or None, the problem or None)."""
    from ..spark.state import StateError

    try:
        version = store._read_version(batch)
        store._verify(version)
    except StateError as error:
        return None, str(error).split(". Nothing ran.")[0]
    return version, None


def verify(spark: Any, location: str) -> int:
    checkpoint = _Checkpoint(spark, location)
    store = _store(spark, location)
    committed = checkpoint.batches("commits")
    last = committed[-1] if committed else None
    layout = store.layout
    print(
        f"state: first micro-batch {layout.first_batch}, keeps {layout.keep} versions, window {layout.window}"
    )
    print(f"Spark: last committed micro-batch {last}; the next one reads version {last}")
    status, whole = 0, []
    for batch in range(max(layout.first_batch, (last or 0) - layout.keep + 1), (last or 0) + 1):
        version, problem = _check(store, batch)
        if problem is None:
            whole.append(batch)
            print(f"version {batch}: whole, {version.rows} parked rows in {len(version.segments)} segments")
        else:
            print(f"version {batch}: DAMAGED: {problem}")
            status = 1 if batch == last else status
    if status:
        if whole:
            print(f"the way out that keeps every row: kaw-state rewind {location} --to {whole[-1]}")
        print(f"the way out that loses version {last}'s parked rows: kaw-state accept-loss {location}")
    return status


def rewind(spark: Any, location: str, to: int, yes: bool) -> int:
    checkpoint = _Checkpoint(spark, location)
    store = _store(spark, location)
    fresh = to == store.layout.first_batch - 1  # before the state began: start it afresh
    version, problem = (None, None) if fresh else _check(store, to)
    if problem is not None or (not fresh and to < store.layout.first_batch):
        print(f"cannot rewind to {to}: {problem or 'the state begins later'}")
        return 1
    later = [b for b in checkpoint.batches("offsets") if b > to]
    compacted = [
        f"sources/{source}/{name}"
        for source in checkpoint.names("sources")
        for name in checkpoint.names(f"sources/{source}")
        if name.endswith(".compact") and int(name.split(".")[0]) > to
    ]
    if compacted:
        print(f"cannot rewind to {to}: a file source compacted its log after it ({', '.join(compacted)})")
        return 1
    rows = version.rows if version is not None else 0
    start = "the parked state starts afresh" if fresh else f"version {to} is whole ({rows} parked rows)"
    print(
        f"rewind to micro-batch {to}: {start}; micro-batches {', '.join(map(str, later)) or '(none)'} run "
        "again from the source: their lookups run again, the source must still hold their input, and the "
        "sink overwrites their output per batch id"
    )
    if not yes:
        print("nothing changed (add --yes to do it)")
        return 0
    for batch in later:
        for folder in ("offsets", "commits"):
            checkpoint.delete(f"{folder}/{batch}")
        for source in checkpoint.names("sources"):
            checkpoint.delete(f"sources/{source}/{batch}")
        if batch % store.layout.slots != to % store.layout.slots:
            checkpoint.delete(f"async_state/manifest/{batch % store.layout.slots:04d}")
    if fresh:
        checkpoint.delete("async_state")
    print("done: start the query again")
    return 0


def accept_loss(spark: Any, location: str, yes: bool) -> int:
    from ..spark.small_files import read_text, write_text
    from ..spark.state import Version

    checkpoint = _Checkpoint(spark, location)
    store = _store(spark, location)
    committed = checkpoint.batches("commits")
    if not committed:
        print("no committed micro-batch: nothing to do")
        return 0
    last = committed[-1]
    version, problem = _check(store, last)
    if problem is None:
        print(f"version {last} is whole ({version.rows} parked rows): nothing to do")
        return 0
    path = store.path("manifest", last)
    lost = "the parked rows it held (how many is unknown: its manifest is gone)"
    try:
        text = read_text(spark, path)
        if text is not None and Version.from_json(text).batch == last:
            lost = f"its {Version.from_json(text).rows} parked rows"
    except (ValueError, KeyError, TypeError):
        pass
    print(
        f"version {last} is damaged ({problem}); replacing it by an empty version loses {lost}: they "
        "never reach the sink, later rows of their keys do"
    )
    if not yes:
        print("nothing changed (add --yes to do it)")
        return 0
    write_text(spark, path, Version(last, 0).to_json())
    print("done: start the query again")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # a usage error exits before a JVM starts
    spark = _session()
    try:
        return _dispatch(spark, args)
    finally:
        spark.stop()


def run(spark: Any, argv: list[str]) -> int:
    """One command, as ``kaw-state ARGV`` runs it, on a session the caller owns."""
    return _dispatch(spark, _parser().parse_args(argv))


def _dispatch(spark: Any, args: argparse.Namespace) -> int:
    if args.command == "verify":
        return verify(spark, args.checkpoint)
    if args.command == "rewind":
        return rewind(spark, args.checkpoint, args.to, args.yes)
    return accept_loss(spark, args.checkpoint, args.yes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kaw-state", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("verify", "rewind", "accept-loss"):
        command = commands.add_parser(name)
        command.add_argument("checkpoint", help="the query's checkpoint location")
        if name == "rewind":
            command.add_argument("--to", type=int, required=True, help="the last micro-batch to keep")
        if name != "verify":
            command.add_argument("--yes", action="store_true", help="do it (without: only say what it costs)")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
