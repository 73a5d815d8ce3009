"""A lookup service that costs next to nothing per request, so a benchmark measures the library.

The project's Python test service (``keyed_async_wait.app.service``) takes most of a core while
a job runs on a 2-core machine, so a job's rows/s against it measure the service as much as the
library. :func:`nginx_echo` serves the same ``GET /users/{id}`` with Debian's nginx and its echo
module instead (about 25 us of CPU a request): one worker, keep-alive without a limit, the
answer after ``latency`` seconds (``echo_sleep``), ``{"user_id": <id>, "name": "user-<id>"}``.
Missing packages (``nginx-light``, ``libnginx-mod-http-echo``) are installed with apt-get when
the benchmark runs as root; otherwise it says what to install. :func:`lookup_service` picks one
or the other by name (``--service python|nginx`` in the benchmarks that take it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from keyed_async_wait.app.embedded import stop_process
from keyed_async_wait.app.service import free_port

__all__ = ["SERVICES", "lookup_service", "nginx_echo"]

SERVICES = ("python", "nginx")
MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")
PACKAGES = ("nginx-light", "libnginx-mod-http-echo")

CONFIG = """
load_module {module};
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {work}/body;
  proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fastcgi;
  uwsgi_temp_path {work}/uwsgi;
  scgi_temp_path {work}/scgi;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location ~ ^/users/(?<uid>[0-9]+)$ {{
      default_type application/json;
      echo_sleep {latency};
      echo -n '{{"user_id": $uid, "name": "user-$uid"}}';
    }}
  }}
}}
"""


def _installed() -> str | None:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    return nginx if nginx is not None and MODULE.exists() else None


def _install() -> str:
    """nginx with the echo module: found, or installed with apt-get (root only)."""
    found = _installed()
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise RuntimeError(f"nginx with its echo module is needed: apt-get install {' '.join(PACKAGES)}")
    install = ["apt-get", "install", "-y", "-q", *PACKAGES]
    if subprocess.run(install, capture_output=True, timeout=600).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600)
        subprocess.run(install, capture_output=True, timeout=600, check=True)
    found = _installed()
    if found is None:
        raise RuntimeError(
            f"apt-get installed {' '.join(PACKAGES)} but no nginx with the echo module is found"
        )
    return found


def _wait_ready(url: str, proc: subprocess.Popen[bytes], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded: nginx announces nothing when it listens
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/users/1", timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nginx did not answer within {seconds} s")


@contextlib.contextmanager
def nginx_echo(latency: float) -> Iterator[str]:
    """``GET /users/{id}`` served by nginx after ``latency`` seconds, on a free loopback port;
    its base URL. Stopped at the end of the block."""
    nginx = _install()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kaw-nginx-") as work:
        conf = Path(work) / "nginx.conf"
        conf.write_text(CONFIG.format(module=MODULE, work=work, port=port, latency=latency))
        proc = subprocess.Popen([nginx, "-c", str(conf), "-p", work], stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc)
            yield url
        finally:
            stop_process(proc)


@contextlib.contextmanager
def lookup_service(kind: str, latency: float = 0.02) -> Iterator[str]:
    """The users service of ``kind`` ("python": the project's test service in its own process;
    "nginx": :func:`nginx_echo`); its base URL."""
    if kind == "nginx":
        with nginx_echo(latency) as url:
            yield url
        return
    if kind != "python":
        raise ValueError(f"service {kind!r}; allowed: {', '.join(SERVICES)}")
    from lookup_throughput import service_process

    with service_process(latency) as url:
        yield url
