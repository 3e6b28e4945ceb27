"""``python -m gqa_decode_fuzz.record.repro FILE [--device cpu|cuda] [--impl TARGET]``."""

import sys

from .replay import main

sys.exit(main())
