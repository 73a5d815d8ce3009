"""Where a record stands in a chain of named steps (FLIP-455's declared callbacks): pure.

A record's :class:`ChainProgress` is the steps it finished, in order, with their results, and
how often each step was tried. It travels with the record: a dict record carries it under
:data:`PROGRESS_FIELD` (the object itself while the record is in this process, which a snapshot
pickles; :meth:`ChainProgress.encode` text in a parked row's state). So whatever keeps the record (a
retry, a deferral, parked state, a snapshot) keeps its progress, and the record resumes at the
first step it has not finished.

Invariants: steps are chosen in their declared order; a step a record finished is never chosen
for it again; a miss (a step with no result) ends the chain, and no later step is chosen.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .exceptions import ConfigError

__all__ = ["PROGRESS_FIELD", "ChainProgress", "check_step_names", "ddl_names"]

PROGRESS_FIELD = "_kaw_chain"
_PICKLED = "pickle:"


@dataclass
class ChainProgress:
    done: list[str] = field(default_factory=list)  # finished steps, in order
    results: dict[str, Any] = field(default_factory=dict)  # step -> its result (None: a miss)
    tries: dict[str, int] = field(default_factory=dict)  # step -> calls started
    ended: bool = False  # a step missed: the rest do not run

    @classmethod
    def of(cls, record: Any) -> ChainProgress:
        """The progress a record carries (a fresh one when it carries none)."""
        held = record.get(PROGRESS_FIELD) if isinstance(record, Mapping) else None
        if isinstance(held, ChainProgress):
            return held
        return cls.decode(held) if held else cls()

    @staticmethod
    def encoded(held: Any) -> str | None:
        """What a record carries under PROGRESS_FIELD, as text for parked state (None: none)."""
        if isinstance(held, ChainProgress):
            return held.encode()
        return held if isinstance(held, str) and held else None

    def next_step(self, names: Sequence[str]) -> int | None:
        """The index of the step to run next; None when the chain is over for the record."""
        if self.ended:
            return None
        finished = len(self.done)
        if self.done != list(names[:finished]):
            raise ConfigError(
                "chain steps",
                list(names),
                f"the steps this record's progress was made with, in that order: {self.done} first",
            )
        return finished if finished < len(names) else None

    def started(self, name: str) -> bool:
        """Count a call of ``name``; True when it is a retry (an earlier call did not finish)."""
        before = self.tries.get(name, 0)
        self.tries[name] = before + 1
        return before > 0

    def finish(self, name: str, result: Mapping[str, Any] | None) -> None:
        self.done.append(name)
        self.results[name] = dict(result) if result is not None else None
        if result is None:
            self.ended = True

    def view(self, record: Any) -> Any:
        """What a step sees: the record's fields, then the earlier steps' result fields over them
        (a dict record; any other record is handed on as it is)."""
        if not isinstance(record, Mapping):
            return record
        merged = {k: v for k, v in record.items() if k != PROGRESS_FIELD}
        for name in self.done:
            result = self.results.get(name)
            if result:
                merged.update(result)
        return merged

    def output(self, fields: Mapping[str, Sequence[str]]) -> dict[str, Any] | None:
        """The chain's result: every finished step's fields, None for the steps a miss skipped;
        None (a miss) when the first step missed."""
        if not self.done or self.results.get(self.done[0]) is None:
            return None
        out: dict[str, Any] = {}
        for name, names in fields.items():
            result = self.results.get(name)
            if result is not None:
                out.update(result)
            else:
                out.update(dict.fromkeys(names))
        return out

    def encode(self) -> str:
        data = {"done": self.done, "results": self.results, "tries": self.tries, "ended": self.ended}
        try:
            return json.dumps(data, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):  # results JSON cannot hold exactly: kept as they are
            return _PICKLED + base64.b64encode(pickle.dumps(data)).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> ChainProgress:
        if text.startswith(_PICKLED):
            data = pickle.loads(base64.b64decode(text[len(_PICKLED) :]))
        else:
            data = json.loads(text)
        return cls(list(data["done"]), dict(data["results"]), dict(data["tries"]), bool(data["ended"]))


def check_step_names(names: Sequence[str]) -> None:
    if not names:
        raise ConfigError("steps", [], "at least one Step")
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError("step name", name, "an identifier (letters, digits, _)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError("step names", twice, "each step named once")


def ddl_names(ddl: str) -> list[str]:
    """The top-level column names of a Spark DDL string (``"a int, b struct<x:int,y:int>"``)."""
    names, depth, start = [], 0, 0
    for i, char in enumerate(ddl + ","):
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            column = ddl[start:i].strip()
            if column:
                name = column.split()[0].split(":")[0]
                names.append(name.strip("`"))
            start = i + 1
    return names
