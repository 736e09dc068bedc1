"""The ``topokeeper`` command line: ``run`` is the installed command (pyproject's console script); ``main`` parses
and dispatches; planning from files, the operator commands, Kueue and login are its modules."""

from topokeeper.cli.main import run

__all__ = ["run"]
