"""Check the built artifacts in ``dist/`` (``./run dist``): the wheel made from the sdist holds
the same files as one made from the tree, every package of the tree with its ``py.typed``, and
the version of ``keyed_async_wait.__version__``.

    python -m tests.dist.check_artifacts DIST_DIR TREE_WHEEL_DIR
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("keyed_async_wait", "lookup", "sql_ext")


def tree_packages() -> set[str]:
    found = set()
    for top in TOP:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(str(init.parent.relative_to(ROOT)))
    return found


def files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def main() -> None:
    dist, direct = Path(sys.argv[1]), Path(sys.argv[2])
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    [tree_wheel] = direct.glob("*.whl")
    problems = []
    if files(wheel) != files(tree_wheel):
        problems.append(
            f"the sdist's wheel differs from the tree's: {sorted(files(wheel) ^ files(tree_wheel))}"
        )
    held = files(wheel)
    for package in sorted(tree_packages()):
        if f"{package}/__init__.py" not in held:
            problems.append(
                f"package {package} is in the tree but not in the wheel ([tool.setuptools] packages)"
            )
    for top in TOP:
        if f"{top}/py.typed" not in held:
            problems.append(f"{top}/py.typed is not in the wheel")
    sources = {p.relative_to(ROOT).as_posix() for top in TOP for p in (ROOT / top).rglob("*.py")}
    sources = {s for s in sources if "__pycache__" not in s}
    if missing := sorted(sources - held):
        problems.append(f"modules left out of the wheel: {missing}")
    from keyed_async_wait import __version__

    if f"-{__version__}-" not in wheel.name or f"-{__version__}.tar.gz" not in sdist.name:
        problems.append(f"artifacts {wheel.name}, {sdist.name} do not carry version {__version__}")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    for needed in ("README.md", "CHANGELOG.md", "pyproject.toml"):
        if not any(n.endswith("/" + needed) for n in names):
            problems.append(f"the sdist has no {needed}")
    if problems:
        sys.exit("\n".join(problems))
    print(f"artifacts checked: {wheel.name} ({len(held)} files), {sdist.name}")


if __name__ == "__main__":
    main()
