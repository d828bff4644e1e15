"""``python -m bench.sustained``: see bench/sustained/cli.py and bench/README.md."""

import sys

try:
    from bench.sustained.cli import main
except ModuleNotFoundError as exc:
    if exc.name != "psutil":
        raise
    sys.exit("sustained: error: psutil is not installed (pip install -e '.[bench]')")

sys.exit(main())
