"""The Spark runtime and Spark data in and out (layer 6 of DESIGN.md).

``execute(fn, workers=W, runtime="spark", master="local[W]")`` runs the workers as a PySpark
barrier stage; ``from_dataframe`` / ``to_parquet`` / ``collect`` connect dataflows to Spark data.
"""

from tokenflow.spark.runtime import execute_runtime

__all__ = ["execute_runtime"]
