"""``python -m cli`` in a checkout: the ``gqa-decode-fuzz`` console script."""

import sys

from . import main

sys.exit(main())
