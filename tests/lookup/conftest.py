"""HTTP tests run once per client: the lean one (on llhttp) and aiohttp."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lookup.http_client import HTTP_CLIENTS


@pytest.fixture(params=[c for c in HTTP_CLIENTS if c != "auto"])
def http_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``KAW_HTTP`` set to each client in turn (read when a lookup makes its client)."""
    monkeypatch.setenv("KAW_HTTP", request.param)
    yield request.param
