"""Commands packed by hiredis on our lookups' connections: the bytes redis-py would send, or
the error it would raise, whatever the arguments."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

from lookup.redis_packing import hiredis_packing

ARGUMENTS = st.one_of(
    st.text(max_size=8),  # any code point, lone surrogates too (both refuse those)
    st.binary(max_size=8),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.binary(max_size=4).map(memoryview),
    st.binary(max_size=4).map(bytearray),
)
COMMANDS = st.sampled_from(["GET", "MGET", "CONFIG GET", b"HMGET", b"CLIENT  LIST", "TYPE"])


def packed(connection: Any, args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return ("bytes", b"".join(bytes(part) for part in connection.pack_command(*args)))
    except Exception as exc:  # the error is what is compared
        return ("error", type(exc))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command=COMMANDS, args=st.lists(ARGUMENTS, max_size=6), encoding=st.sampled_from(["utf-8", "latin-1"]))
def test_the_same_bytes_or_the_same_error_as_redis_py(command: Any, args: list[Any], encoding: str) -> None:
    ours = hiredis_packing(Connection)(encoding=encoding)
    theirs = Connection(encoding=encoding)
    assert packed(ours, (command, *args)) == packed(theirs, (command, *args))


def test_a_batch_of_keys_is_packed_in_one_piece() -> None:
    keys = [f"price:{i}" for i in range(500)] + ["é:ü", b"raw"]
    ours = hiredis_packing(Connection)().pack_command("MGET", *keys)
    assert len(ours) == 1
    assert ours[0] == b"".join(Connection().pack_command("MGET", *keys))


@pytest.mark.parametrize("base", [Connection, SSLConnection, UnixDomainSocketConnection])
def test_the_class_the_url_asks_for_is_kept(base: type) -> None:
    fast = hiredis_packing(base)
    assert issubclass(fast, base) and fast is hiredis_packing(base)  # made once per class
