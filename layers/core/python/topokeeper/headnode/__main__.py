"""``python3 -m topokeeper.headnode MODE BUNDLE ...``: the head-node program's command line."""

import sys

from topokeeper.headnode.main import main

sys.exit(main())
