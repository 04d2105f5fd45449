"""Bulk jobs on the message store with PySpark: reprocess, archive (and audit), on ``local[*]`` or a cluster.

    from openroute.spark import archive, build_session, reprocess

    spark = build_session()                                  # local[*]; or build_session("spark://host:7077")
    job = reprocess(spark, "sqlite:///openroute.db", service="crm", since="7d")          # a dry run: the plan
    archive(spark, "sqlite:///openroute.db", keep="OK=30d,FAILED=180d", to="/data/openroute-archive")
    audit(spark, "sqlite:///openroute.db").write("audit-out")  # report.html, summary.json, Parquet

Each job is a function taking a :class:`pyspark.sql.SparkSession` (any session works; :func:`build_session`
makes one with the JDBC drivers on its class path) and the store's SQLAlchemy URL; ``openroute spark ...``
runs the same functions from the command line. Importing this package does not import PySpark.
"""

from __future__ import annotations

from openroute.spark.apply import ApplyResult, apply_plan
from openroute.spark.archive import ArchiveError, ArchiveResult, archive, read_archive
from openroute.spark.audit import AuditError, AuditResult, CheckResult, audit
from openroute.spark.reprocess import ReprocessFilter, ReprocessResult, reprocess
from openroute.spark.session import SparkSetupError, build_session, jdbc_source, read_table

__all__ = [
    "ApplyResult",
    "ArchiveError",
    "ArchiveResult",
    "AuditError",
    "AuditResult",
    "CheckResult",
    "ReprocessFilter",
    "ReprocessResult",
    "SparkSetupError",
    "apply_plan",
    "archive",
    "audit",
    "build_session",
    "jdbc_source",
    "read_archive",
    "read_table",
    "reprocess",
]
