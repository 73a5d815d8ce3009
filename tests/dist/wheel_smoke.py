"""The wheel as users install it (``./run smoke``): run by a clean virtual environment's
Python, isolated (``-I``), from a directory outside the checkout.

The README's first example as written (against a local service), the three waits on a small
DataFrame, the SQL functions, the console scripts, ``py.typed``, and mypy seeing the public API
from a user's script. Exits non-zero, saying why, on failure.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

USER_SCRIPT = """
from keyed_async_wait import AsyncDataStream, RetryStrategy
from pyspark.sql import DataFrame


async def double(record: dict) -> dict:
    return {"twice": record["n"] * 2}


def enrich(df: DataFrame) -> DataFrame:
    return AsyncDataStream.key_ordered_wait(
        df, double, key="k", order_by="n", output_schema="twice long", retry=RetryStrategy.fixed_delay(2, 0.1)
    )
"""
USER_MISTAKE = """
from keyed_async_wait import AsyncDataStream
from pyspark.sql import DataFrame


def enrich(df: DataFrame, fn: object) -> DataFrame:
    return AsyncDataStream.ordered_wait(df, fn, capacity="many")
"""


def check(condition: bool, why: str) -> None:
    if not condition:
        sys.exit(f"wheel smoke test failed: {why}")


def installed() -> None:
    for package in ("keyed_async_wait", "lookup", "sql_ext"):
        module = importlib.import_module(package)
        root = Path(module.__file__ or "").parent
        check("site-packages" in root.parts, f"{package} imported from {root}, not the installed wheel")
        check((root / "py.typed").is_file(), f"{package}/py.typed missing")
    import keyed_async_wait

    version = importlib.metadata.version("keyed-async-wait")
    check(
        version == keyed_async_wait.__version__,
        f"metadata {version} != __version__ {keyed_async_wait.__version__}",
    )


async def double(record: dict) -> dict:
    await asyncio.sleep(0)
    return {"twice": record["n"] * 2}


def spark_jobs() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import sql_ext
    from keyed_async_wait import AsyncDataStream

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = spark.createDataFrame([(i % 3, i) for i in range(20)], "k long, n long")
        want = sorted((i % 3, i, 2 * i) for i in range(20))
        waits = {
            "ordered_wait": AsyncDataStream.ordered_wait(df, double, output_schema="twice long"),
            "unordered_wait": AsyncDataStream.unordered_wait(df, double, output_schema="twice long"),
            "key_ordered_wait": AsyncDataStream.key_ordered_wait(
                df, double, key="k", order_by="n", output_schema="twice long"
            ),
        }
        for name, out in waits.items():
            got = sorted(tuple(r) for r in out.collect())
            check(got == want, f"{name} gave {got[:3]}...")
        installed_sql = sql_ext.install(spark)
        installed_sql.register("twice_of", double, inputs=["n"], output_schema="twice long")
        df.createOrReplaceTempView("t")
        table = spark.sql("SELECT k, n, twice FROM async_lookup(TABLE(t), 'twice_of')").collect()
        check(sorted(tuple(r) for r in table) == want, "async_lookup gave other rows")
        scalar = spark.sql("SELECT k, n, twice_of(n).twice FROM t").collect()
        check(sorted(tuple(r) for r in scalar) == want, "the scalar function gave other rows")
    finally:
        spark.stop()


def readme_first_example(work: Path, readme: Path) -> None:
    """The README's first block, as a new user copies it, pointed at a local service."""
    from keyed_async_wait.app.service import ServiceState, run_service

    block = re.search(r"<!-- readme: name first -->\n```python\n(.*?)^```", readme.read_text(), re.S | re.M)
    check(block is not None, "the README has no first example marked <!-- readme: name first -->")
    assert block is not None
    script = work / "first_example.py"
    with run_service(ServiceState()) as (url, _):
        script.write_text(block.group(1).replace("http://users-svc", url))
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, cwd=work, env=env, timeout=300
        )
    check(done.returncode == 0, f"the README's first example: {done.stderr[-2000:]}")
    for user_id in (7, 8, 9):  # the table show() prints: every row enriched, the score typed
        check(
            re.search(rf"\|\s*{user_id}\|user-{user_id}\|\s*[0-9.]+\|", done.stdout) is not None,
            f"the README's first example printed no enriched row for {user_id}: {done.stdout[-1000:]}",
        )


def console_scripts(work: Path) -> None:
    bin_dir = Path(sys.executable).parent
    for script in ("kaw-enrich", "kaw-state"):
        done = subprocess.run([bin_dir / script, "--help"], capture_output=True, text=True, timeout=120)
        check(
            done.returncode == 0 and "usage" in done.stdout.lower(), f"{script} --help: {done.stderr[-500:]}"
        )
    target = work / "kaw.zip"
    done = subprocess.run([bin_dir / "kaw-pyfiles", str(target)], capture_output=True, text=True, timeout=120)
    check(done.returncode == 0, f"kaw-pyfiles: {done.stderr[-500:]}")
    with zipfile.ZipFile(target) as archive:
        check("keyed_async_wait/__init__.py" in archive.namelist(), "kaw-pyfiles wrote no keyed_async_wait")


def types_seen(work: Path) -> None:
    good, bad = work / "user_job.py", work / "user_mistake.py"
    good.write_text(USER_SCRIPT)
    bad.write_text(USER_MISTAKE)
    mypy = [sys.executable, "-m", "mypy", "--no-incremental", "--ignore-missing-imports"]
    done = subprocess.run([*mypy, str(good)], capture_output=True, text=True, cwd=work, timeout=300)
    check(done.returncode == 0, f"mypy on a correct user script: {done.stdout[-1000:]}")
    done = subprocess.run([*mypy, str(bad)], capture_output=True, text=True, cwd=work, timeout=300)
    check(
        done.returncode == 1 and "capacity" in done.stdout,
        f"mypy did not see the API's types (capacity='many' passed): {done.stdout[-1000:]}",
    )


def main() -> None:
    readme = Path("README.md").resolve()  # ./run smoke puts it beside this script
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.chdir(work)
        installed()
        readme_first_example(work, readme)
        console_scripts(work)
        types_seen(work)
        spark_jobs()
    print("wheel smoke test passed")


if __name__ == "__main__":
    main()
