"""A SparkSession set up the way Riverbed's source and sink need it: in this
process (`local[*]`), on a cluster (`spark://HOST:PORT`), or through Spark
Connect (`sc://HOST:PORT`).

PySpark facts measured on this machine (DESIGN.md, Spark): Python workers must
run the interpreter that has Riverbed installed (`PYSPARK_PYTHON`), the driver
should bind to loopback on a machine without a resolvable host name
(`SPARK_LOCAL_IP`), and a local session wants few shuffle partitions and no UI.
A driver given a cluster's master binds to the machine's first non-loopback
address unless told otherwise (`spark.driver.host`, `spark.driver.bindAddress`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.errors import InvalidInput
from riverbed.spark.options import MASTER_ENV, is_local

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
    master: str | None = None,
    app_name: str = "riverbed",
    *,
    remote: str | None = None,
    quiet: bool = True,
    config: Mapping[str, str] | None = None,
    ship: bool | None = None,
) -> SparkSession:
    """Build (or return the running) SparkSession with the `riverbed` data source
    registered.

    `master=None` runs Spark in this process's JVM on every core (`local[*]`),
    with Python workers on this interpreter, the driver on 127.0.0.1, the UI off
    and 4 shuffle partitions. A master URL (`spark://host:7077`, `local[2]`)
    connects there. The cluster's Python workers run the interpreter that
    `PYSPARK_PYTHON` names (this one unless set before the call): it needs
    Riverbed's dependencies (`riverbed[spark]`); Riverbed itself is shipped from
    here (`ship`, default on for a master other than `local[...]`: a zip of this
    process's `riverbed` package added with `addPyFile`, so executors run the
    driver's version).

    `remote="sc://host:15002"` is a Spark Connect session instead (`master`
    must be None): the server plans and runs everything, so its Python needs
    `riverbed[spark]` installed; nothing is shipped.

    `config` is more Spark settings for the session built here (for example
    `spark.driver.host` and `spark.driver.bindAddress` for a driver the
    cluster's machines reach at a particular address, `spark.executor.memory`).

    `quiet` (the default) keeps Spark's and py4j's logging to errors, without
    the warnings and InterruptedException traces of a streaming query stopped
    on purpose; `quiet=False` leaves Spark's own logging (warnings and up). Either
    applies only to the session that starts the JVM.
    """
    from pyspark.sql import SparkSession

    if remote is not None:
        if master is not None:
            raise InvalidInput(
                f"give a master ({master!r}) or a Spark Connect URL ({remote!r}), not both"
            )
        if not remote.startswith("sc://"):
            raise InvalidInput(f"Spark Connect URL {remote!r} must start with sc://")
        builder: Any = SparkSession.builder.remote(remote).appName(app_name)
        for name, value in (config or {}).items():
            builder = builder.config(name, value)
        connected: SparkSession = builder.getOrCreate()
        register(connected)
        return connected

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ[MASTER_ENV] = master or "local[*]"
    builder = SparkSession.builder.appName(app_name)
    if master is None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.master("local[*]")
        for name, value in LOCAL_SETTINGS.items():
            builder = builder.config(name, value)
    else:
        builder = builder.master(master).config("spark.ui.showConsoleProgress", "false")
    for name, value in (config or {}).items():
        builder = builder.config(name, value)
    if quiet:
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()}"
        )
        # py4j logs a callback interrupted by a query's stop as an error, with its trace.
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
    spark: SparkSession = builder.getOrCreate()
    if ship if ship is not None else not is_local(master):
        spark.sparkContext.addPyFile(str(riverbed_zip()))
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Register the `riverbed` data source with a SparkSession."""
    from riverbed.spark.source import RiverbedDataSource

    spark.dataSource.register(RiverbedDataSource)


def riverbed_zip() -> Path:
    """A zip of the `riverbed` package this process imports (Python files only),
    in a temporary directory removed when the process exits."""
    import atexit

    import riverbed

    package = Path(riverbed.__file__).parent
    folder = Path(tempfile.mkdtemp(prefix="riverbed-ship-"))
    atexit.register(shutil.rmtree, folder, True)
    target = folder / "riverbed.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*.py")):
            archive.write(path, Path("riverbed") / path.relative_to(package))
    return target
