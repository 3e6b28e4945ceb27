"""``python -m properties.repro FILE [--device cpu|cuda] [--impl TARGET]``."""

import sys

from .replay import main

sys.exit(main())
