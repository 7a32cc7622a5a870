"""Search benchmark: the same as `mugraph bench search` (see mugraph.bench_search)."""
import sys

from mugraph.bench_search import main

if __name__ == "__main__":
    sys.exit(main())
