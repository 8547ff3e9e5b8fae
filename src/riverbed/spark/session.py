"""A SparkSession set up the way Riverbed's source and sink need it.

PySpark facts measured on this machine (DESIGN.md, Spark): Python workers must
run the interpreter that has Riverbed installed (`PYSPARK_PYTHON`), the driver
should bind to loopback on a machine without a resolvable host name
(`SPARK_LOCAL_IP`), and a local session wants few shuffle partitions and no UI.
"""

from __future__ import annotations

import os
import sys
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


def session(master: str | None = None, app_name: str = "riverbed") -> SparkSession:
    """Build (or return the running) SparkSession with the `riverbed` data source
    registered.

    `master=None` runs Spark in this process's JVM on every core (`local[*]`),
    with Python workers on this interpreter, the driver on 127.0.0.1, the UI off
    and 4 shuffle partitions. A master URL (`spark://host:7077`, `local[2]`)
    connects there; its workers need Riverbed installed in the interpreter that
    `PYSPARK_PYTHON` names (set it before calling if theirs differs from ours).
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
    spark = builder.getOrCreate()
    from riverbed.spark import register

    register(spark)
    return spark
