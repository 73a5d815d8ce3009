"""The EVALSHA calls a batch of :class:`~lookup.RedisWrite` writes becomes: each write's
arguments, in calls of up to :data:`~lookup.redis_write_scripts.CHUNK` writes, one slot's
(keys declared, :data:`~lookup.redis_write_scripts.SCRIPT`) or one master's (keys as
arguments, :data:`~lookup.redis_write_scripts.SCRIPT_PER_MASTER`)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from .exceptions import TemplateError
from .redis_nodes import by_master, slots_of
from .redis_write_scripts import CHUNK, SHA, SHA_PER_MASTER, version_key
from .writes import to_json

__all__ = ["Command", "Item", "WriteCalls", "by_slot", "script_call"]

Item = tuple[Any, Hashable, str | None]  # a write: its record, its key, its version
Command = tuple[int | None, tuple[Any, ...]]  # the slot that routes it (None: one node), its words


class WriteCalls:
    """How one writer's records become script arguments and calls."""

    def __init__(
        self, command: str, fields: Sequence[str], deleted: str | None, ttl_ms: int, tombstone_ms: int
    ) -> None:
        self.command = command
        self.fields = tuple(fields)
        self.deleted = deleted
        self._ttl_text, self._tombstone_text = str(ttl_ms), str(tombstone_ms)

    def command_of(self, record: Any) -> str:
        if self.deleted is not None and record.get(self.deleted):
            return "DEL"
        return self.command

    def arguments(self, record: Any, version: str | None) -> list[Any]:
        """The script's arguments for one write (after its keys)."""
        command = self.command_of(record)
        # every argument a str: the connection then packs the command with hiredis, in C
        args: list[Any] = [version or "", command, self._ttl_text, self._tombstone_text]
        if command == "DEL":
            return [*args, "0"]
        try:
            values = {name: record[name] for name in self.fields}
        except KeyError as exc:
            raise TemplateError(f"fields={list(self.fields)}", exc.args[0], record) from None
        if command == "SET":
            return [*args, "1", to_json(values)]
        pairs: list[Any] = []
        removed: list[Any] = []
        for name, value in values.items():
            if value is None:
                removed.append(name)  # read back as missing: NULL for an optional field
            else:
                pairs += [name, value if isinstance(value, str) else to_json(value)]
        return [*args, str(1 + len(pairs) + len(removed)), str(len(pairs)), *pairs, *removed]

    def queue(
        self,
        commands: list[Command],
        items: list[Item],
        group: list[int],
        out: list[Any],
        slot: int | None,
        token: str,
        per_master: bool = False,
    ) -> list[list[int]]:
        """EVALSHA calls for the writes of ``group`` (indexes into ``items``; on a cluster all
        of ``slot``, or with ``per_master`` all of ``slot``'s master), added to ``commands``;
        the writes of each call. A write whose record lacks a field gets its error in ``out``."""
        calls: list[list[int]] = []
        keys: list[Any] = []
        args: list[Any] = []
        members: list[int] = []
        cluster = slot is not None
        for i in group:
            record, target, version = items[i]
            try:
                words = self.arguments(record, version)
            except TemplateError as exc:
                out[i] = exc
                continue
            pair = [target, version_key(str(target), cluster)]
            if per_master:
                args += [*pair, *words]
            else:
                keys += pair
                args += words
            members.append(i)
            if len(members) == CHUNK:
                commands.append((slot, script_call(keys, token, args, per_master)))
                calls.append(members)
                keys, args, members = [], [], []
        if members:
            commands.append((slot, script_call(keys, token, args, per_master)))
            calls.append(members)
        return calls

    def per_master(
        self, client: Any, items: list[Item], out: list[Any], token: str
    ) -> tuple[list[Command], list[list[int]], list[int]]:
        """Calls of :data:`~lookup.redis_write_scripts.SCRIPT_PER_MASTER` for the writes, one
        master's writes each (routed by one of their slots), the writes of each call, and the
        writes whose slot has no master known."""
        slots = slots_of([str(target) for _, target, _ in items])
        shares, unknown = by_master(client, slots)
        commands: list[Command] = []
        calls: list[list[int]] = []
        for _, group in shares.values():  # routed by its first write's slot
            calls += self.queue(commands, items, group, out, slots[group[0]], token, per_master=True)
        return commands, calls, unknown


def script_call(keys: list[Any], token: str, args: list[Any], per_master: bool) -> tuple[Any, ...]:
    """One EVALSHA of the writes' ``keys`` (none declared ``per_master``) and arguments."""
    if per_master:
        return ("EVALSHA", SHA_PER_MASTER, "0", token, *args)
    return ("EVALSHA", SHA, str(len(keys)), *keys, token, *args)


def by_slot(items: list[Item], indexes: list[int]) -> dict[int | None, list[int]]:
    """``indexes`` (of writes in ``items``), grouped by their key's cluster slot (each group in
    the order given)."""
    groups: dict[int | None, list[int]] = {}
    for i, slot in zip(indexes, slots_of([str(items[i][1]) for i in indexes]), strict=True):
        groups.setdefault(slot, []).append(i)
    return groups
