"""``python -m cli COMMAND`` in the repository (``gqa-decode-fuzz COMMAND`` installed)."""

import sys

from . import main

sys.exit(main())
