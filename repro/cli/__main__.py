"""``python -m repro.cli``: the ``repro`` command."""

import sys

from repro.cli import main

sys.exit(main())
