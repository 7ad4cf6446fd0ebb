"""``python -m tokenflow``: the ``tokenflow`` command (``tokenflow.cli``)."""

from tokenflow.cli import main

main()
