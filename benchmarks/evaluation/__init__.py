"""The timestamp-tokens paper's evaluation (Lattuada, McSherry et al., *Timestamp tokens: a
better coordination primitive for data-processing systems*, 2022, §7) reproduced on tokenflow.

Run each script as a module from the repository root (``make evaluation`` runs them all):

- ``python -m benchmarks.evaluation.granularity``  Fig. 6: timestamp granularity sweep
- ``python -m benchmarks.evaluation.overhead``     what a timestamp costs, closed loop (why Fig. 6)
- ``python -m benchmarks.evaluation.scaling``      Fig. 7: 1 and 2 workers, thread and process
- ``python -m benchmarks.evaluation.chains``       Fig. 8: chains of idle operators
- ``python -m benchmarks.evaluation.nexmark``      §7.4: NEXMark Q4 and Q7 until DNF

Each takes ``--quick``.  ``harness`` is the open-loop harness they share, ``wordcount`` the
rolling word count in the three coordination styles.  The report is ``docs/EVALUATION.md``.
"""
