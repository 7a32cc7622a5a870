"""Search benchmark: the same as `mugraph bench search` (see mugraph.search.bench)."""
import sys

from mugraph.search.bench import main

if __name__ == "__main__":
    sys.exit(main())
