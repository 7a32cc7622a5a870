"""`python -m mugraph` is the command line."""
import sys

from mugraph.cli import main

sys.exit(main())
