"""A SparkSession set up the way Riverbed's source and sink need it.

PySpark facts measured on this machine (DESIGN.md, Spark): Python workers must
run the interpreter that has Riverbed installed (`PYSPARK_PYTHON`), the driver
should bind to loopback on a machine without a resolvable host name
(`SPARK_LOCAL_IP`), and a local session wants few shuffle partitions and no UI.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCAL_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}
"""Settings for a session this function builds (a given master keeps its own
shuffle partitions)."""


QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")
"""Spark's logging when quiet: errors only, none from a stopped streaming query."""


def session(
    master: str | None = None, app_name: str = "riverbed", *, quiet: bool = True
) -> SparkSession:
    """Build (or return the running) SparkSession with the `riverbed` data source
    registered.

    `master=None` runs Spark in this process's JVM on every core (`local[*]`),
    with Python workers on this interpreter, the driver on 127.0.0.1, the UI off
    and 4 shuffle partitions. A master URL (`spark://host:7077`, `local[2]`)
    connects there; its workers need Riverbed installed in the interpreter that
    `PYSPARK_PYTHON` names (set it before calling if theirs differs from ours).

    `quiet` (the default) keeps Spark's and py4j's logging to errors, without
    the warnings and InterruptedException traces of a streaming query stopped
    on purpose; `quiet=False` leaves Spark's own logging (warnings and up). Either
    applies only to the session that starts the JVM.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.master("local[*]")
        for name, value in LOCAL_SETTINGS.items():
            builder = builder.config(name, value)
    else:
        builder = builder.master(master).config("spark.ui.showConsoleProgress", "false")
    if quiet:
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()}"
        )
        # py4j logs a callback interrupted by a query's stop as an error, with its trace.
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
    spark = builder.getOrCreate()
    from riverbed.spark import register

    register(spark)
    return spark
