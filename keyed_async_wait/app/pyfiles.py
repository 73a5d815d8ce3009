"""``kaw-pyfiles OUT.zip``: this library as a zip for ``spark-submit --py-files``.

PySpark puts ``.zip``, ``.egg`` and ``.py`` files given to ``--py-files`` on the executors'
``sys.path``, but not ``.whl`` files, so a wheel passed there fails on the executors with
``ModuleNotFoundError``. This writes the three packages (``keyed_async_wait``, ``lookup``,
``sql_ext``), from wherever they are installed, into one zip. The executors' Python still needs
the dependencies (``aiohttp``, ``redis``, ``hiredis``, ``tenacity``, ``pyarrow``).
"""

from __future__ import annotations

import argparse
import importlib
import zipfile
from pathlib import Path

__all__ = ["PACKAGES", "main", "write_zip"]

PACKAGES = ("keyed_async_wait", "lookup", "sql_ext")


def write_zip(target: Path) -> list[str]:
    """Write the packages' source files into ``target``; the names written."""
    names: list[str] = []
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in PACKAGES:
            root = Path(importlib.import_module(package).__file__ or "").parent
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed"):
                    name = f"{package}/{path.relative_to(root).as_posix()}"
                    archive.write(path, name)
                    names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kaw-pyfiles", description=__doc__)
    parser.add_argument("target", type=Path, help="the zip to write, e.g. dist/kaw.zip")
    args = parser.parse_args(argv)
    names = write_zip(args.target)
    print(f"{args.target}: {len(names)} files of {', '.join(PACKAGES)}; pass it to spark-submit --py-files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
