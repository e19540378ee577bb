"""``python -m benchmarks``: the benchmark suite (see ``benchmarks/cli.py`` and README.md)."""

import sys

from benchmarks.cli import main

sys.exit(main())
