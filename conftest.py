"""The repository's pytest configuration: load the suite's plugin (``gqa_decode_fuzz.runner.plugin``).

Importing the plugin first pins an xdist worker to its GPU, before anything can initialise CUDA. An installed copy
loads the same module through its ``pytest11`` entry point (off in this repository: pyproject.toml's
``-p no:gqa_decode``); where that copy is already loaded (``pytest --pyargs gqa_decode_fuzz.properties`` run from
another folder reads this file too), it is the same module, so it is not loaded twice.
"""

import sys

PLUGIN = "gqa_decode_fuzz.runner.plugin"

if PLUGIN not in sys.modules:
    pytest_plugins = [PLUGIN]
