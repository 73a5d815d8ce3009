"""Every code block of the README and of the docs (``docs/**/*.md``) runs as written, with
local services substituted.

Python blocks run as scripts (one marked ``<!-- readme: after NAME -->`` after the Python block
marked ``<!-- readme: name NAME -->`` on its page); SQL blocks run statement by statement after
the Python setup the same page names that way; bash blocks run in a copy of the project, with
``spark://host:7077`` turned into a two-executor ``local-cluster`` and the executors' Python
one on which only ``--py-files`` can provide this library. The README's test command is what
``.ci/run`` runs; this test does not run it again from inside the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from keyed_async_wait.app.service import ServiceState

from ..processes import run_bounded

pytestmark = pytest.mark.spark

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(
    r"(?P<marks>(?:<!--\s*readme:[^>]*-->\s*\n)*)```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.S | re.M
)
_MARK = re.compile(r"<!--\s*readme:\s*(\w+)\s*([^>]*?)\s*-->")


class Block:
    def __init__(self, page: Path, number: int, lang: str, body: str, marks: dict[str, str]) -> None:
        self.page, self.number, self.lang, self.body, self.marks = page, number, lang, body, marks

    @property
    def id(self) -> str:
        first = next((line for line in self.body.splitlines() if line.strip()), "")
        where = self.page.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        return f"{where}-{self.number}-{self.lang}-{re.sub(r'[^A-Za-z0-9_.]+', '_', first)[:40]}"


def blocks(pages: list[Path] = PAGES) -> list[Block]:
    found = []
    for page in pages:
        for number, match in enumerate(_BLOCK.finditer(page.read_text())):
            marks = {m.group(1): m.group(2) for m in _MARK.finditer(match.group("marks"))}
            found.append(Block(page, number, match.group("lang"), match.group("body"), marks))
    return found


def _named(page: Path, name: str) -> Block:
    (block,) = [b for b in blocks([page]) if b.marks.get("name") == name]
    return block


def _substitute(text: str, services: dict[str, str]) -> str:
    for placeholder, local in services.items():
        text = text.replace(placeholder, local)
    return text


@pytest.fixture
def services(service: Any, redis_url: str, tmp_path: Path) -> dict[str, str]:
    import redis

    url, _ = service
    client = redis.Redis.from_url(redis_url)
    for sku in range(10):
        client.set(f"price:{sku}", '{"price": %s}' % (1 + sku))
    client.close()
    return {
        "http://users-svc": url,
        "https://api.example.com": url,  # the HTTP API guide's service: GET /api/users/{id}
        "redis://cache:6379/0": redis_url,
        "s3://bucket/": f"{tmp_path}/bucket/",
    }


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "USERS_API_KEY": "readme-test-key",
        "USERS_API_TOKEN": ServiceState().api_token,  # what the service's /api/ wants
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def _run_python(code: str, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(code)
    done = run_bounded([sys.executable, str(script)], timeout=300, cwd=tmp_path, env=_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def _isolated_python(tmp_path: Path) -> Path:
    """A Python that has every dependency but cannot import this library (as a fresh
    executor would), so only ``--py-files`` can bring it."""
    import sysconfig

    venv = tmp_path / "executor-venv"
    run = run_bounded([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    assert run.returncode == 0, run.stderr
    site = Path(sysconfig.get_paths()["purelib"])
    (
        venv
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / "site-packages"
        / "deps.pth"
    ).write_text(
        f"{site}\n"  # a path line: its own .pth files (the editable install's) are not read
    )
    python = venv / "bin" / "python"
    probe = run_bounded([str(python), "-c", "import keyed_async_wait"], timeout=60, cwd=tmp_path)
    assert probe.returncode != 0, "the executors' Python must not see the library without --py-files"
    return python


JOB = """
import os, sys
from pyspark.sql import SparkSession
from keyed_async_wait import AsyncDataStream
from lookup import Field, HttpLookup
spark = SparkSession.builder.config("spark.sql.shuffle.partitions", "4").getOrCreate()
assert spark.conf.get("spark.sql.exec.async-lookup.timeout") == "30s"
users = HttpLookup("http://users-svc/users/{user_id}", fields=[Field("name")])
data = [(i, i % 9, i % 40) for i in range(200)]
orders = spark.createDataFrame(data, "seq long, order_id long, user_id long")
rows = AsyncDataStream.key_ordered_wait(orders, users, key="order_id", order_by="seq").collect()
assert len(rows) == 200 and all(r.name == f"user-{r.user_id}" for r in rows), rows[:3]
print("job ok", len(rows))
spark.stop()
"""


def _run_bash(block: Block, services: dict[str, str], tmp_path: Path) -> None:
    if "./run tests" in block.body:
        assert "./run tests" in (ROOT / ".ci" / "run").read_text()  # CI runs it, on every push
        done = run_bounded(["bash", "-c", "./run job"], timeout=600, cwd=ROOT, env=_env())
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert '"orders_out_of_order": 0' in done.stdout
        return
    work = tmp_path / "project"
    work.mkdir()
    (work / "job.py").write_text(_substitute(JOB, services))
    env = _env()
    env["PYSPARK_PYTHON"] = str(_isolated_python(tmp_path))
    script = _substitute(block.body, {**services, "spark://host:7077": "local-cluster[2,1,1024]"})
    done = run_bounded(["bash", "-euo", "pipefail", "-c", script], timeout=600, cwd=work, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-5000:]
    assert "job ok 200" in done.stdout


def _sql_script(block: Block, services: dict[str, str]) -> str:
    setup = _named(block.page, block.marks["after"]).body
    statements = [s.strip() for s in block.body.split(";") if s.strip()]
    lines = [setup, "for statement in " + repr(statements) + ":", "    spark.sql(statement).collect()"]
    return _substitute("\n".join(lines), services)


@pytest.mark.parametrize("block", blocks(), ids=lambda b: b.id)
def test_readme_block_runs_as_written(block: Block, services: dict[str, str], tmp_path: Path) -> None:
    if block.lang == "python":  # after the named block it continues, when it names one
        setup = _named(block.page, block.marks["after"]).body + "\n" if "after" in block.marks else ""
        _run_python(_substitute(setup + block.body, services), tmp_path)
    elif block.lang == "sql":
        _run_python(_sql_script(block, services), tmp_path)
    elif block.lang == "bash":
        _run_bash(block, services, tmp_path)
    else:
        assert block.lang in ("", "text"), f"a {block.lang!r} block this test cannot run"
        assert "readme:" not in block.body


def test_the_docs_have_blocks_of_every_kind() -> None:
    kinds = {b.lang for b in blocks()}
    assert {"python", "sql", "bash"} <= kinds
    assert any(b.page == README and b.lang == "python" for b in blocks())
    assert shutil.which("bash")
