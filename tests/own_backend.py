"""The backend of the guide "Write your own backend" (``docs/guide/backends.md``, the block
named ``own-backend``) as a module, so that its tests run on exactly the class the guide shows,
and Spark's workers (which import this module to unpickle it) get the same class."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "backends.md"


def _block(name: str) -> str:
    text = PAGE.read_text()
    found = re.search(rf"<!--\s*readme:\s*name\s+{name}\s*-->\s*\n```python\n(.*?)^```", text, re.S | re.M)
    assert found, f"no python block named {name!r} in {PAGE}"
    return found.group(1)


# the guide's class, defined here as the guide defines it
exec(compile(_block("own-backend"), str(PAGE), "exec"), globals())
