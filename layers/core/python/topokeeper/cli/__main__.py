"""``python -m topokeeper.cli.main``: the ``topokeeper`` command."""

from topokeeper.cli.main import run

run()
