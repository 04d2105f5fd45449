"""The Spark session of the openroute jobs and how they read the message store over JDBC.

Every job (reprocess, audit, archive) takes a :class:`pyspark.sql.SparkSession`; :func:`build_session` makes
one for ``local[*]`` (the embedded default) or any ``master`` (``spark://...``, ``k8s://...``, ``yarn``) with
the JDBC drivers of the distribution on its class path and Spark's own logging quiet::

    from openroute.spark.session import build_session, read_table

    spark = build_session()                       # local[*], drivers from /usr/share/java
    messages = read_table(spark, "sqlite:///openroute.db", "message", partitions=4)

:func:`read_table` reads a table in parallel id-range partitions and returns the store's timestamps as Spark
timestamps (UTC) on SQLite and PostgreSQL alike. What cannot work (no Java, no driver, a database that does
not answer) raises :class:`SparkSetupError` with one line saying what to install or fix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa

from openroute.definitions.errors import ConfigurationError
from openroute.persistence.column_types import UTCDateTime
from openroute.persistence.models import Base
from openroute.persistence.secrets import mask_secrets, masked_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: where Debian/Ubuntu packages put their jars (libpostgresql-jdbc-java, libxerial-sqlite-jdbc-java)
DEFAULT_JAR_DIRS: tuple[Path, ...] = (Path("/usr/share/java"),)

#: environment variable naming a jar or a folder of jars to search before the distribution's folder
JDBC_PATH_ENV = "OPENROUTE_JDBC_PATH"


class SparkSetupError(ConfigurationError):
    """Spark cannot run the job here (no Java, no PySpark, no JDBC driver, database unreachable); nothing ran.

    ``str(error)`` is one line saying what to install or fix; the CLI prints it and exits with status 2.
    """


@dataclass(frozen=True)
class JdbcDriver:
    """A JDBC driver the jobs know: its class, the jar names it ships as, and the package that installs it."""

    backend: str
    driver_class: str
    jar_prefixes: tuple[str, ...]
    package: str


DRIVERS: dict[str, JdbcDriver] = {
    "postgresql": JdbcDriver("postgresql", "org.postgresql.Driver", ("postgresql",), "libpostgresql-jdbc-java"),
    "sqlite": JdbcDriver(
        "sqlite", "org.sqlite.JDBC", ("sqlite-jdbc", "xerial-sqlite-jdbc"), "libxerial-sqlite-jdbc-java"
    ),
}


@dataclass(frozen=True)
class JdbcSource:
    """Where Spark reads a store: the JDBC URL and the connection properties (user, password, driver)."""

    url: str
    properties: dict[str, str]
    backend: str

    def describe(self) -> str:
        """The URL without credentials, for messages."""
        return self.url


def _search_dirs(jdbc_path: str | os.PathLike[str] | None) -> list[Path]:
    places: list[Path] = []
    for given in (jdbc_path, os.environ.get(JDBC_PATH_ENV)):
        if given:
            places.append(Path(given))
    places.extend(DEFAULT_JAR_DIRS)
    return places


def find_driver_jar(backend: str, jdbc_path: str | os.PathLike[str] | None = None) -> Path | None:
    """The jar of ``backend``'s JDBC driver (``postgresql`` or ``sqlite``), or None when none is installed.

    Looks at ``jdbc_path`` (a jar or a folder), then ``$OPENROUTE_JDBC_PATH``, then /usr/share/java.
    """
    driver = DRIVERS.get(backend)
    if driver is None:
        raise SparkSetupError(f"no JDBC driver known for {backend!r}: use sqlite:/// or postgresql+psycopg://")
    for place in _search_dirs(jdbc_path):
        if place.is_file() and place.name.endswith(".jar"):
            if place.name.startswith(driver.jar_prefixes):
                return place
            continue
        if not place.is_dir():
            continue
        jars = sorted(p for p in place.glob("*.jar") if p.name.startswith(driver.jar_prefixes))
        if jars:
            # the unversioned symlink (postgresql.jar) if there is one, else the newest-looking name
            plain = [p for p in jars if p.stem in driver.jar_prefixes]
            return plain[0] if plain else jars[-1]
    return None


def driver_jars(jdbc_path: str | os.PathLike[str] | None = None) -> list[Path]:
    """The jars of every known driver that is installed (a session with all of them can read any store)."""
    return [jar for jar in (find_driver_jar(b, jdbc_path) for b in DRIVERS) if jar is not None]


def java_problem() -> str | None:
    """None when a Java runtime is there, else what to install."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return None
    if shutil.which("java"):
        return None
    return "no Java runtime: install one (apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME"


_LOG4J = """\
status = error
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
# PySpark counts as a shell: without its own level here Spark resets the console to WARN and says so
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = {level}
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
"""


def _conf_dir(level: str) -> Path:
    """A Spark configuration folder whose log4j2.properties sets Spark's own log level."""
    folder = Path(tempfile.gettempdir()) / f"openroute-spark-conf-{os.getuid()}-{level}-v3"
    folder.mkdir(exist_ok=True)
    path = folder / "log4j2.properties"
    if not path.exists():
        path.write_text(_LOG4J.format(level=level))
    return folder


def build_session(
    master: str | None = None,
    *,
    app_name: str = "openroute",
    jdbc_path: str | os.PathLike[str] | None = None,
    log_level: str = "error",
    config: dict[str, str] | None = None,
    jvm_log: str | os.PathLike[str] | None = None,
    remote: str | None = None,
) -> SparkSession:
    """A SparkSession for the openroute jobs (or the running one, which keeps its own settings).

    - ``master``: ``local[*]`` by default (every core of this machine), or a cluster URL.
    - ``jdbc_path``: a jar or folder holding the JDBC drivers, searched before /usr/share/java.
    - ``log_level``: Spark's own log level (``error`` by default; ``off``, ``warn``, ``info``...).
    - ``config``: more Spark settings (``spark.executor.memory``...).
    - ``jvm_log``: a file that receives the JVM's own stderr (its start-up notes, any Java stack trace)
      instead of this process's stderr; only used when this call starts the JVM.

    - ``remote``: a Spark Connect server (``sc://host:port``, see :mod:`openroute.spark.connect`) to run on
      instead of starting a JVM here; ``master``, ``jdbc_path`` and ``jvm_log`` are then the server's business.

    Times are UTC (``spark.sql.session.timeZone``), the UI is off on ``local`` masters. Raises
    :class:`SparkSetupError` when PySpark or Java is missing, or the Connect server does not answer.
    """
    if remote is not None:
        return _remote_session(remote, app_name, config)
    try:
        from pyspark.sql import SparkSession
    except ImportError as missing:
        raise SparkSetupError(f"PySpark is not installed: pip install 'openroute[spark]' ({missing})") from None
    problem = java_problem()
    if problem:
        raise SparkSetupError(problem)
    master = master or "local[*]"
    # read by the JVM that getOrCreate launches: Spark's log level from its very first line
    os.environ.setdefault("SPARK_CONF_DIR", str(_conf_dir(log_level.lower())))
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
    )
    if master.startswith("local"):
        builder = builder.config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "8")
    jars = driver_jars(jdbc_path)
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    try:
        with _stderr_to(jvm_log):
            session = builder.getOrCreate()
    except Exception as error:  # the JVM did not start: say why in one line
        where = f" (JVM log: {jvm_log})" if jvm_log else ""
        raise SparkSetupError(f"Spark did not start on {master}: {first_line(error)}{where}") from None
    session.sparkContext.setLogLevel(log_level.upper())
    return session


def _remote_session(remote: str, app_name: str, config: dict[str, str] | None) -> SparkSession:
    """A Spark Connect client session on ``remote``; its first query proves the server answers."""
    if not remote.startswith("sc://"):
        raise SparkSetupError(f"--remote takes a Spark Connect URL like sc://127.0.0.1:15002, got {remote!r}")
    try:
        from pyspark.sql import SparkSession
    except ImportError as missing:
        raise SparkSetupError(f"PySpark is not installed: pip install 'openroute[spark-connect]' ({missing})") from None
    builder = SparkSession.builder.remote(remote).appName(app_name).config("spark.sql.session.timeZone", "UTC")
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
        session.version  # noqa: B018  one round trip that runs no Spark job: the server answers
    except ImportError as missing:  # pandas, pyarrow, grpcio...: the client's own dependencies
        raise SparkSetupError(f"the Spark Connect client needs pip install 'openroute[spark-connect]' ({missing})"
                              ) from None
    except Exception as error:
        raise SparkSetupError(f"no Spark Connect server answers at {remote}: {first_line(error)}") from None
    return session


@contextlib.contextmanager
def _stderr_to(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the block runs: a JVM started inside keeps it as its stderr."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def first_line(error: BaseException) -> str:
    """The root cause of a (Java) exception as one line, without its stack trace."""
    text = str(error).strip()
    java = getattr(error, "java_exception", None)
    if java is not None:
        cause = java
        while cause.getCause() is not None:
            cause = cause.getCause()
        text = str(cause.toString())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "Traceback", "File ", "py4j")):
            return mask_secrets(line)[:300]
    return type(error).__name__


def jdbc_source(url: str, jdbc_path: str | os.PathLike[str] | None = None) -> JdbcSource:
    """The JDBC URL and properties for a store's SQLAlchemy ``url`` (``sqlite:///path``,
    ``postgresql+psycopg://user:password@host:port/db``). Raises :class:`SparkSetupError` for another
    database, a SQLite file that does not exist, or a missing driver jar."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as bad:
        raise SparkSetupError(f"not a database URL: {masked_url(url)!r} ({mask_secrets(str(bad))})") from None
    backend = parsed.get_backend_name()
    driver = DRIVERS.get(backend)
    if driver is None:
        raise SparkSetupError(f"unsupported database {backend!r} in {masked_url(url)!r}: use sqlite:/// or postgresql+psycopg://")
    if find_driver_jar(backend, jdbc_path) is None:
        raise SparkSetupError(
            f"no {backend} JDBC driver: apt-get install -y {driver.package} (jars in /usr/share/java) "
            f"or set {JDBC_PATH_ENV} to the jar"
        )
    properties = {"driver": driver.driver_class}
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise SparkSetupError(f"the store needs a SQLite file, got {masked_url(url)!r}")
        path = Path(parsed.database).resolve()
        if not path.is_file():
            raise SparkSetupError(f"no SQLite store at {path}: check the database URL")
        return JdbcSource(f"jdbc:sqlite:{path}", properties, backend)
    host = parsed.host or "localhost"
    port = f":{parsed.port}" if parsed.port else ""
    if parsed.username:
        properties["user"] = parsed.username
    if parsed.password:
        properties["password"] = str(parsed.password)
    return JdbcSource(f"jdbc:postgresql://{host}{port}/{parsed.database or ''}", properties, backend)


def _timestamp_columns(table: str) -> list[str]:
    known = Base.metadata.tables.get(table)
    if known is None:
        return []
    return [c.name for c in known.columns if isinstance(c.type, UTCDateTime)]


def _custom_schema(table: str, backend: str, columns: Sequence[str] | None = None) -> str | None:
    """Spark types for the store's columns where JDBC metadata would mislead Spark.

    SQLite declares JSON and timestamp columns with names its driver maps to numbers or parses in local
    time: they are read as text (timestamps are parsed in Spark, as UTC). PostgreSQL's jsonb is read as text.
    """
    known = Base.metadata.tables.get(table)
    if known is None:
        return None
    types: list[str] = []
    for column in known.columns:
        if columns is not None and column.name not in columns:
            continue
        kind = column.type
        if backend == "sqlite":
            if isinstance(kind, sa.Integer):
                types.append(f"{column.name} BIGINT")
            else:
                types.append(f"{column.name} STRING")
        elif isinstance(kind, sa.JSON):
            types.append(f"{column.name} STRING")
    return ", ".join(types) or None


def _reader(spark: SparkSession, source: JdbcSource) -> Any:
    reader = spark.read.format("jdbc").option("url", source.url)
    for key, value in source.properties.items():
        reader = reader.option(key, value)
    return reader


def read_query(spark: SparkSession, url: str, query: str, jdbc_path: str | os.PathLike[str] | None = None) -> DataFrame:
    """One SQL query on the store as a DataFrame read in a single partition (for small results such as
    bounds and counts). Raises :class:`SparkSetupError` when the database does not answer."""
    source = jdbc_source(url, jdbc_path)
    try:
        return cast("DataFrame", _reader(spark, source).option("query", query).load())
    except Exception as error:
        raise SparkSetupError(f"cannot read {source.describe()}: {first_line(error)}") from None


def store_sql(statement: sa.sql.ClauseElement, backend: str) -> str:
    """``statement`` as SQL text for ``backend`` (``postgresql`` or ``sqlite``), its values inlined as literals.

    The jobs hand Spark's JDBC source a subquery (``dbtable``) so that the database does the filtering; the
    values are rendered by SQLAlchemy's literal processors (quoted and escaped), never pasted in by hand."""
    from sqlalchemy.dialects.postgresql.base import PGDialect
    from sqlalchemy.dialects.sqlite.base import SQLiteDialect

    # PGDialect has no typed __init__ (SQLAlchemy stubs); "named": a "%" is not doubled as for psycopg's format
    dialect: sa.Dialect = (PGDialect(paramstyle="named") if backend == "postgresql"  # type: ignore[no-untyped-call]
                           else SQLiteDialect())
    return str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


@dataclass(frozen=True)
class IdRange:
    """The lowest and highest id of a table: where a partitioned read splits (``lo > hi``: no rows)."""

    lo: int
    hi: int


def id_ranges(spark: SparkSession, url: str, tables: Sequence[str],
              jdbc_path: str | os.PathLike[str] | None = None) -> dict[str, IdRange]:
    """The :class:`IdRange` of each of ``tables`` (the store's tables, keyed by ``id``), in one query and one Spark job.

    ``MIN(id)`` and ``MAX(id)`` are answered from the primary key's index, whatever the table's size: a job reads
    its tables split over these ranges instead of running its filter a second time for the bounds of the rows it
    selects. Raises :class:`SparkSetupError` when the database does not answer, ``ValueError`` for a table the
    models do not know.
    """
    unknown = [table for table in tables if table not in Base.metadata.tables]
    if unknown:
        known = ", ".join(sorted(Base.metadata.tables))
        raise ValueError(f"no store table {', '.join(map(repr, unknown))} (known: {known})")
    if not tables:
        return {}
    source = jdbc_source(url, jdbc_path)
    parts = [f"(SELECT MIN(id) FROM {table}) AS lo{i}, (SELECT MAX(id) FROM {table}) AS hi{i}"  # noqa: S608  the store's own table names
             for i, table in enumerate(tables)]
    schema = ", ".join(f"lo{i} BIGINT, hi{i} BIGINT" for i in range(len(tables)))
    try:
        row = (_reader(spark, source).option("query", f"SELECT {', '.join(parts)}")
               .option("customSchema", schema).load().first())
    except Exception as error:
        where = source.describe()
        named = f"table {tables[0]}" if len(tables) == 1 else f"tables {', '.join(tables)}"
        raise SparkSetupError(f"cannot read {named} from {where}: {first_line(error)}") from None
    ranges = {}
    for i, table in enumerate(tables):
        lo, hi = (None, None) if row is None else (row[f"lo{i}"], row[f"hi{i}"])
        ranges[table] = IdRange(0, -1) if lo is None or hi is None else IdRange(int(lo), int(hi))
    return ranges


def read_table(
    spark: SparkSession,
    url: str,
    table: str,
    partitions: int = 4,
    column: str = "id",
    *,
    jdbc_path: str | os.PathLike[str] | None = None,
    columns: Sequence[str] | None = None,
    where: sa.ColumnElement[bool] | None = None,
    id_range: IdRange | None = None,
) -> DataFrame:
    """``table`` of the store at ``url`` as a DataFrame read in ``partitions`` parallel ranges of ``column``.

    - ``columns`` limits the columns read (all by default);
    - ``where``, a SQLAlchemy condition on the table of :mod:`openroute.persistence.models`, is run by the
      database: Spark reads ``(SELECT columns FROM table WHERE ...)``, never the rows it would drop.

    The ranges split [min, max] of ``column`` over the selected rows (one query first, one row); no rows make
    one empty partition. Given ``id_range`` (from :func:`id_ranges`, ``column`` being ``id``) they split that range
    instead and no query runs first: the database runs ``where`` once, in the partitions' own queries. The store's
    timestamp columns come back as Spark timestamps in UTC on SQLite too (stored there as text). Nothing is
    collected on the driver except the bounds. Raises :class:`SparkSetupError` (one line) when the driver is
    missing or the database does not answer, ``ValueError`` for ``partitions < 1``, ``id_range`` with another
    ``column``, or ``where`` on a table the models do not know.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if id_range is not None and column != "id":
        raise ValueError(f"id_range splits the id column, got column={column!r}")
    source = jdbc_source(url, jdbc_path)
    from pyspark.sql import functions as F

    # the partition column is read too (the ranges split it); the select at the end drops it if not asked for
    read = None if columns is None else [*columns, *([column] if column not in columns else [])]
    relation = _relation(table, read, where, source.backend)
    if id_range is None:
        try:
            bounds = (
                _reader(spark, source)
                .option("query", f"SELECT COUNT(*) AS n, COALESCE(MIN({column}), 0) AS lo, "  # noqa: S608  the relation is the store's own names and SQLAlchemy-rendered literals
                                 f"COALESCE(MAX({column}), 0) AS hi FROM {relation}")
                .option("customSchema", "n BIGINT, lo BIGINT, hi BIGINT")
                .load()
                .first()
            )
        except Exception as error:
            raise SparkSetupError(f"cannot read table {table} from {source.describe()}: {first_line(error)}") from None
        id_range = IdRange(int(bounds["lo"]), int(bounds["hi"])) if bounds is not None and bounds["n"] else None
    reader = _reader(spark, source).option("dbtable", relation)
    schema = _custom_schema(table, source.backend, read)
    if schema:
        reader = reader.option("customSchema", schema)
    if id_range is not None and id_range.hi >= id_range.lo:
        lo, hi = id_range.lo, id_range.hi
        reader = (
            reader.option("partitionColumn", column)
            .option("lowerBound", str(lo))
            .option("upperBound", str(hi + 1))
            .option("numPartitions", str(max(1, min(partitions, hi - lo + 1))))
        )
    try:
        frame = cast("DataFrame", reader.load())
    except Exception as error:
        raise SparkSetupError(f"cannot read table {table} from {source.describe()}: {first_line(error)}") from None
    if source.backend == "sqlite":
        for name in _timestamp_columns(table):
            if name in frame.columns:
                frame = frame.withColumn(name, F.to_timestamp(F.col(name)))
    if columns is not None:
        frame = frame.select(*columns)
    return frame


def _relation(table: str, columns: Sequence[str] | None, where: sa.ColumnElement[bool] | None, backend: str) -> str:
    """What Spark reads: the table itself, or a subquery of its ``columns`` and ``where`` (an aliased SELECT)."""
    if where is None and columns is None:
        return table
    known = Base.metadata.tables.get(table)
    if known is None:
        raise ValueError(f"no store table {table!r} to filter (known: {', '.join(sorted(Base.metadata.tables))})")
    query = sa.select(*(known.c[name] for name in columns)) if columns is not None else sa.select(known)
    if where is not None:
        query = query.where(where)
    return f"({store_sql(query, backend)}) AS selected_{table}"
