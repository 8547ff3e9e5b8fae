"""Spark Structured Streaming and batch reads and writes of Riverbed topics.

    from riverbed.spark import session
    spark = session()  # local[*], the `riverbed` data source registered
    spark = session("spark://host:7077")  # a cluster (PostgreSQL storage)
    spark = session(remote="sc://host:15002")  # Spark Connect

    spark.read.format("riverbed").option("db", URL).option("topic", "orders").load()
    spark.readStream.format("riverbed").option("db", URL).option("subscription", "s").load()
    df.write.format("riverbed").option("db", URL).option("topic", "out").mode("append").save()
    by_stream(df, "out", URL).write.format("riverbed")...  # one task per stream (PostgreSQL)

Needs the `riverbed[spark]` extra (pyspark, pyarrow, the ADBC drivers) and a
JVM. Options are listed in `riverbed.spark.options`.
"""

from __future__ import annotations

from riverbed.spark.distribution import by_stream
from riverbed.spark.options import check_shared_storage
from riverbed.spark.session import register, session

__all__ = ["by_stream", "check_shared_storage", "register", "session"]
