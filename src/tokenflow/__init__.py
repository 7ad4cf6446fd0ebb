"""tokenflow: timely dataflow for Python, with workers on Apache Spark.

See DESIGN.md for the layers; the public entry points are re-exported here.
"""

__version__ = "0.1.0"
