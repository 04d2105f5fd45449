"""Bulk jobs on the message store with PySpark: reprocess, archive (and audit), on ``local[*]`` or a cluster.

    from openroute.spark import build_session, read_table

Each job is a function taking a :class:`pyspark.sql.SparkSession` (see :mod:`openroute.spark.session` for
making one with the JDBC drivers) and the store's SQLAlchemy URL; ``openroute spark ...`` runs the same
functions from the command line. Importing this package does not import PySpark.
"""

from __future__ import annotations

from openroute.spark.session import SparkSetupError, build_session, jdbc_source, read_table

__all__ = ["SparkSetupError", "build_session", "jdbc_source", "read_table"]
