"""``python -m bench`` runs the benchmark; see bench/README.md."""

import sys

from bench.run import main

sys.exit(main())
