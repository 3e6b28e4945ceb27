"""The repository's pytest configuration: load the suite's plugin (properties/_plugin/plugin.py), which brings
the prompt end of its xdist workers (properties/_plugin/prompt_exit.py) with it.

The plugin pins an xdist worker to its GPU when it is imported, before anything can
initialise CUDA. An installed copy of the suite loads the same plugin through its
``pytest11`` entry point instead (pyproject.toml turns that copy off in this repository).
Where that copy is already loaded (an editable install, ``pytest --pyargs gqa_decode_fuzz.properties`` run
from another folder, collects this checkout's files and so reads this file), loading a second copy would add
every option twice: the checkout's package names become aliases of the installed ones instead
(properties/_plugin/aliases.py).
"""

import sys

if "gqa_decode_fuzz.properties._plugin.plugin" in sys.modules:
    from gqa_decode_fuzz.properties._plugin import aliases

    aliases.install()
else:
    pytest_plugins = ["properties._plugin.plugin"]
