"""Redis commands packed by hiredis's C packer on our lookups' connections.

redis-py's asyncio connection packs every command in Python, argument by argument; measured,
an MGET of 500 keys costs about 0.8 µs of CPU per key to pack, as much as everything else
our record path does for that key. hiredis (a dependency) packs the same bytes in C at about
0.1 µs a key. :func:`hiredis_packing` gives a connection class whose commands of plain ``str``
and ``bytes`` arguments (every command a lookup sends) are packed by hiredis; any other
argument (a number, a memoryview, a wrong type) goes to redis-py's own packing, so the bytes
sent and the errors raised are redis-py's. A property test checks the two give equal bytes.
"""

from __future__ import annotations

from typing import Any

import hiredis

__all__ = ["hiredis_packing"]

_PLAIN = frozenset((str, bytes))  # what hiredis packs exactly as redis-py's encoder does
_UTF8 = ("utf-8", "utf8")
_MADE: dict[type[Any], type[Any]] = {}


def hiredis_packing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` (a redis-py asyncio connection class) packing with hiredis; one
    class made per base class."""
    made = _MADE.get(connection_class)
    if made is None:
        made = _MADE[connection_class] = _packing_with_hiredis(connection_class)
    return made


def _packing_with_hiredis(connection_class: type[Any]) -> type[Any]:
    def pack_command(self: Any, *args: Any) -> list[bytes]:
        encoder = self.encoder
        plain = encoder.encoding.lower() in _UTF8 and encoder.encoding_errors == "strict"
        if not plain or not args or not all(map(_PLAIN.__contains__, map(type, args))):
            return base_pack(self, *args)
        # as redis-py: a command name with spaces ('CONFIG GET') is sent as separate words
        first = args[0]
        if type(first) is str:
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        return [hiredis.pack_command(args)]

    base_pack = connection_class.pack_command
    name = f"HiredisPacking{connection_class.__name__}"
    return type(name, (connection_class,), {"pack_command": pack_command, "__module__": __name__})
