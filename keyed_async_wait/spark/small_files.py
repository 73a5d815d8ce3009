"""The parked state's small files (layout, manifests, reports), read and written as text, and
the sizes of the files of its parts.

A folder holds one text file (``part-00000.txt``); its lines are the content. On a classic
session they go through Hadoop's ``FileSystem`` in the driver's JVM (any filesystem Spark
reads, with the session's Hadoop settings): a few milliseconds, where a DataFrame write is a
Spark job of its own (planning, a task, the output committer: about 0.3 s, paid by every
micro-batch for its manifest); a ``file:`` path is written with Python's own file calls
(Hadoop's local filesystem forks a ``chmod`` per file it creates). On Spark Connect there is
no JVM to call: DataFrames do it.
A folder's earlier content is removed first (a slot is rewritten only once no version refers to
it), then the file is written under a hidden name and renamed into place, so a reader (Spark's
included: it skips hidden files) sees the whole file or none, never half a manifest.
"""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from .metrics import is_connect

__all__ = ["committed_batches", "driver_disk_folder", "file_sizes", "read_text", "write_text"]

_NAME = "part-00000.txt"


def read_text(spark: SparkSession, path: str) -> str | None:
    """The lines of the files in folder ``path`` (or in the folders a glob matches), or None
    when there are none."""
    if is_connect(spark):
        return _read_with_dataframes(spark, path)
    fs, pattern = _filesystem(spark, path)
    lines: list[str] = []
    for folder in sorted(fs.globStatus(pattern) or [], key=lambda s: s.getPath().toString()):
        if not folder.isDirectory():
            continue
        for status in sorted(fs.listStatus(folder.getPath()), key=lambda s: s.getPath().getName()):
            if status.isFile() and not status.getPath().getName().startswith(("_", ".")):
                lines += _read_file(spark, fs, status.getPath()).splitlines()
    return "\n".join(lines) or None


def write_text(
    spark: SparkSession, path: str, text: str, *, known: dict[str, Path | None] | None = None
) -> None:
    """Replace folder ``path``'s content by one file holding ``text``. ``known``: where the
    folders written so far are (:func:`driver_disk_folder`), kept by the caller."""
    if is_connect(spark):
        spark.createDataFrame([(text,)], "value string").coalesce(1).write.mode("overwrite").text(path)
        return
    local = driver_disk_folder(spark, path, {} if known is None else known)
    if local is not None:  # Hadoop's local filesystem forks a chmod per file it creates
        _write_local(local, text)
        return
    fs, folder = _filesystem(spark, path)
    view = _view(spark)
    hidden = view.Path(folder, f".{_NAME}.tmp")
    fs.delete(folder, True)  # what it held: version n - slots, which no version refers to any more
    stream = fs.create(hidden, True)
    try:
        stream.write(bytearray((text + "\n").encode()))
    finally:
        stream.close()
    if not fs.rename(hidden, view.Path(folder, _NAME)):
        raise OSError(f"could not rename {hidden.toString()} in place")


def driver_disk_folder(spark: SparkSession, path: str, known: dict[str, Path | None]) -> Path | None:
    """Folder ``path`` on the driver's own disk, or None when it is on another filesystem;
    asked of Hadoop only for a path with neither itself nor a folder above it in ``known``
    (four round trips to the JVM and a copy of the Hadoop settings), and added to it. Below a
    folder on the driver's disk everything is (a ``file:`` path has no mount points); below any
    other, Hadoop is used. The parked state keeps its root here for as long as it keeps its
    layout (a stream's checkpoint does not move while it runs; Spark too resolves its own
    checkpoint files once per run): a micro-batch's manifest then asks the JVM nothing."""
    above = path.rstrip("/")
    below: list[str] = []  # the names from ``above`` down to ``path``
    while above not in known and "/" in above:
        above, name = above.rsplit("/", 1)
        below.insert(0, name)
    if above in known:
        local = known[above]
        return None if local is None else local.joinpath(*below)
    fs, folder = _filesystem(spark, path)
    known[path] = _local_path(fs, folder) if _on_driver_disk(fs) else None
    return known[path]


def _on_driver_disk(fs: Any) -> bool:
    return bool(fs.getScheme() == "file")


def _local_path(fs: Any, folder: Any) -> Path:
    return Path(fs.makeQualified(folder).toUri().getPath())


def _write_local(folder: Path, text: str) -> None:
    """:func:`write_text` on the driver's own disk (the checkpoint's ``file:`` paths). The
    folder stays and the file is replaced in one rename: only what else the folder holds is
    removed (a DataFrame write's files, if a Connect session wrote it). Removing a folder waits
    for the filesystem's journal, which Spark's own checkpoint writes keep busy (measured in a
    stream: 22 ms a removal, 13 ms a micro-batch; the whole write now takes under 1 ms)."""
    folder.mkdir(parents=True, exist_ok=True)
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name != _NAME:
                _remove(entry)
    hidden = folder / f".{_NAME}.tmp"
    hidden.write_text(text + "\n")
    os.replace(hidden, folder / _NAME)


def _remove(entry: os.DirEntry[str]) -> None:
    if entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path)
    else:
        os.unlink(entry.path)


def file_sizes(spark: SparkSession, path: str) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of the files in folder ``path`` that readers see (not hidden), by name."""
    fs, folder = _filesystem(spark, path)
    if _on_driver_disk(fs):
        found = [(e.name, e.stat().st_size) for e in os.scandir(_local_path(fs, folder)) if e.is_file()]
    else:
        found = [(s.getPath().getName(), int(s.getLen())) for s in fs.listStatus(folder) if s.isFile()]
    return tuple(sorted((name, size) for name, size in found if not name.startswith(("_", "."))))


def committed_batches(spark: SparkSession, checkpoint: str) -> list[int]:
    """The micro-batches Spark's commit log says committed."""
    from pyspark.errors import AnalysisException

    try:
        rows = spark.read.format("binaryFile").load(f"{checkpoint}/commits").select("path").collect()
    except AnalysisException:
        return []
    names = [row.path.rsplit("/", 1)[-1] for row in rows]
    return sorted(int(name) for name in names if name.isdigit())


def _view(spark: SparkSession) -> Any:
    """A JVM view of the driver's gateway with the classes used here imported: each hop of a
    dotted name is a round trip to the JVM, and a micro-batch writes its manifest here."""
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    view = _VIEWS.get(gateway)  # per gateway: a session stopped and started again has a new one
    if view is None:
        from py4j.java_gateway import java_import

        view = gateway.new_jvm_view("keyed_async_wait.small_files")
        java_import(view, "org.apache.hadoop.fs.Path")
        java_import(view, "org.apache.commons.io.IOUtils")
        _VIEWS[gateway] = view
    return view


_VIEWS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _filesystem(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """Hadoop's FileSystem for ``path``, with the session's Hadoop settings, and the path."""
    folder = _view(spark).Path(path)
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    return folder.getFileSystem(conf), folder


def _read_file(spark: SparkSession, fs: Any, path: Any) -> str:
    stream = fs.open(path)
    try:
        data = _view(spark).IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode()


def _read_with_dataframes(spark: SparkSession, path: str) -> str | None:
    from pyspark.errors import AnalysisException

    try:
        lines = spark.read.text(path).collect()
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            return None
        raise
    return "\n".join(row.value for row in lines) or None
