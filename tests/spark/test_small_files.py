"""The parked state's small files: written whole, replacing what a folder held, read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyed_async_wait.spark import small_files
from keyed_async_wait.spark.small_files import read_text, write_text


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith((".", "_")))


@pytest.mark.compat("parked state: small files")
@pytest.mark.parametrize("through_hadoop", [False, True], ids=["driver-disk", "hadoop"])
def test_a_folder_written_by_dataframes_is_replaced_by_one_whole_file(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, through_hadoop: bool
) -> None:
    if through_hadoop:  # the path every filesystem but the driver's own disk takes
        monkeypatch.setattr(small_files, "_on_driver_disk", lambda fs: False)
    folder = tmp_path / "manifest" / "0003"
    spark.createDataFrame([("old\nlines",)], "value string").coalesce(1).write.text(str(folder))
    assert read_text(spark, str(folder)) == "old\nlines"
    write_text(spark, str(folder), '{"batch": 3}')
    assert _visible(folder) == ["part-00000.txt"]
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert read_text(spark, str(folder)) == '{"batch": 3}'
    assert spark.read.text(str(folder)).collect()[0].value == '{"batch": 3}'  # Spark reads it alike
    write_text(spark, str(folder), "newer")
    assert read_text(spark, str(folder)) == "newer"


@pytest.mark.compat("parked state: small files")
def test_a_missing_folder_reads_as_none_and_a_glob_reads_every_folder_in_order(
    spark: Any, tmp_path: Path
) -> None:
    assert read_text(spark, str(tmp_path / "nothing")) is None
    write_text(spark, str(tmp_path / "report" / "0001"), "second")
    write_text(spark, str(tmp_path / "report" / "0000"), "first")
    assert read_text(spark, str(tmp_path / "report" / "*")) == "first\nsecond"


def test_a_path_on_the_driver_disk_is_resolved_through_hadoop_once_per_map(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    resolve = small_files._filesystem

    def counted(session: Any, path: str) -> Any:
        asked.append(path)
        return resolve(session, path)

    monkeypatch.setattr(small_files, "_filesystem", counted)
    folder = f"file:{tmp_path}/manifest/0001"
    known: dict[str, Path | None] = {}  # as the parked state keeps one per query run
    for text in ("first", "second", "third"):  # a slot written micro-batch after micro-batch
        write_text(spark, folder, text, known=known)
        assert (tmp_path / "manifest" / "0001" / "part-00000.txt").read_text() == text + "\n"
    assert asked == [folder]
    assert known == {folder: tmp_path / "manifest" / "0001"}
    write_text(spark, folder, "fourth")  # without a map: asked again
    assert asked == [folder, folder]


@pytest.mark.parametrize("on_driver_disk", [True, False], ids=["driver-disk", "hadoop"])
def test_folders_under_a_resolved_root_ask_hadoop_nothing(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_driver_disk: bool
) -> None:
    """The parked state resolves its root once; every manifest's slot is under it."""
    if not on_driver_disk:
        monkeypatch.setattr(small_files, "_on_driver_disk", lambda fs: False)
    root = f"file:{tmp_path}/async_state"
    known: dict[str, Path | None] = {}
    expected = tmp_path / "async_state" if on_driver_disk else None
    assert small_files.driver_disk_folder(spark, root, known) == expected
    asked: list[str] = []

    def ask(session: Any, path: str) -> Any:
        asked.append(path)
        raise LookupError(path)

    monkeypatch.setattr(small_files, "_filesystem", ask)
    for slot in ("0000", "0001", "0001"):
        folder = f"{root}/manifest/{slot}"
        local = small_files.driver_disk_folder(spark, folder, known)
        assert local == (None if expected is None else expected / "manifest" / slot)
    assert asked == [] and list(known) == [root]
    if on_driver_disk:
        write_text(spark, f"{root}/manifest/0002", "third", known=known)
        assert (tmp_path / "async_state" / "manifest" / "0002" / "part-00000.txt").read_text() == "third\n"
        assert asked == []
    with pytest.raises(LookupError):  # a path under no known folder: asked
        small_files.driver_disk_folder(spark, f"file:{tmp_path}/elsewhere", known)
    assert asked == [f"file:{tmp_path}/elsewhere"]
