"""``python -m gqa_decode_fuzz.cli``: the ``gqa-decode-fuzz`` console script without the script installed."""

import sys

from . import main

sys.exit(main())
