"""``python -m agentik``: the ``agentik`` command (``agentik.cli``), for a Python without the
console script on its PATH."""

import sys

from agentik.cli import main

if __name__ == "__main__":
    sys.exit(main())
