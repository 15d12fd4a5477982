"""`python -m bench`, the same as the `bench` console script."""

import sys

from bench.entry import main

if __name__ == "__main__":
    sys.exit(main())
