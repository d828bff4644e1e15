"""``python -m bench.sustained``: see bench/sustained/cli.py and bench/README.md."""

import sys

from bench.sustained.cli import main

sys.exit(main())
