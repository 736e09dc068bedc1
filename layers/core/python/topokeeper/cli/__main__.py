"""``python -m topokeeper.cli.main``: the ``topokeeper`` command."""

from topokeeper.cli import run

run()
