"""One Spark application on a cluster that runs ``openroute spark`` commands as they come, for the cluster test.

Run as ``python -m tests.spark.cluster_driver <master URL> <Spark log file>``: it starts the session on the master,
then reads one command a line on stdin (the JSON list of the arguments after ``openroute``), runs it through
``openroute.cli.main`` unchanged and answers one line on stdout, :data:`ANSWER` followed by the JSON object
``{"status": <exit status>, "stdout": ..., "stderr": ...}``, until stdin ends. The commands find the session
running and leave it running (``openroute.spark.cli.run`` does not stop a session its caller started), so the
cluster test's jobs share one driver JVM and one set of executors instead of starting both once per job.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

#: the start of each answer line (the JVM may write its own lines on stdout)
ANSWER = "cluster-driver: "


def serve(master: str, spark_log: str) -> None:
    """Start the session on ``master`` (the JVM's own output to ``spark_log``), then answer each command."""
    from openroute.cli import main
    from openroute.spark.session import build_session
    from tests.spark.processes import JVM_OPTIONS

    # the executors the worker starts for this application run three small jobs: the first JIT tier, as the driver
    spark = build_session(master, app_name="openroute spark (cluster test)", jvm_log=spark_log,
                          config={"spark.executor.extraJavaOptions": JVM_OPTIONS})
    try:
        for line in sys.stdin:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = main(json.loads(line))
            answer = {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}
            print(ANSWER + json.dumps(answer), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
