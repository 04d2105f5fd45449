"""One real Spark session (``local[2]``) for the whole test run, shared by every Spark test.

In CI (``CI=true``) a missing Java, PySpark or JDBC driver is a failure, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import postgres_problem, require, spark_problem


def spark_and_drivers_problem() -> str | None:
    """What keeps the Spark tests from running here (None when Java, PySpark and both drivers are there)."""
    problem = spark_problem()
    if problem:
        return problem
    from openroute.spark.session import DRIVERS, find_driver_jar

    missing = [d.package for d in DRIVERS.values() if find_driver_jar(d.backend) is None]
    if missing:
        return f"no JDBC driver jar: apt-get install -y {' '.join(missing)}"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark_installed() -> None:
    """Java, PySpark and both JDBC drivers are here (for tests that only run ``openroute spark`` as a child)."""
    require("Spark", spark_and_drivers_problem)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The test run's SparkSession (local[2], few shuffle partitions, its JVM run with
    :data:`tests.spark.processes.JVM_OPTIONS`); stopped at the end of the run."""
    require("Spark", spark_and_drivers_problem)
    from openroute.spark.session import build_session
    from tests.spark.processes import JVM_OPTIONS

    jvm_log = tmp_path_factory.mktemp("spark") / "jvm.log"
    session = build_session("local[2]", app_name="openroute-tests", jvm_log=jvm_log,
                            config={"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2",
                                    "spark.driver.extraJavaOptions": JVM_OPTIONS})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def module_databases(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Fresh databases shared by the tests of one module (for children started together): ``sqlite``, a new file,
    and ``postgres``, a new database when the server answers (a test using it calls ``require_database`` first:
    without the server it fails in CI, is skipped elsewhere, and the SQLite tests still run), dropped at the end."""
    urls = {"sqlite": f"sqlite:///{tmp_path_factory.mktemp('module-db') / 'openroute.db'}"}
    databases = None
    if postgres_problem() is None:
        databases = request.getfixturevalue("fresh_databases")
        urls["postgres"] = databases.take()
    try:
        yield urls
    finally:
        if databases is not None:
            databases.release(urls["postgres"])
