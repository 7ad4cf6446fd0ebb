"""The Spark runtime and Spark data in and out (layer 6 of docs/ARCHITECTURE.md).

``execute(fn, workers=W, runtime="spark", master="local[W]")`` runs the workers as a PySpark
barrier stage; ``from_dataframe`` / ``to_parquet`` / ``collect`` connect dataflows to Spark data.
"""

from tokenflow.spark.io import InputError, arrow_source, collect, from_dataframe, to_parquet
from tokenflow.spark.runtime import execute_runtime

__all__ = ["InputError", "arrow_source", "collect", "execute_runtime", "from_dataframe", "to_parquet"]
