"""The repository's pytest configuration: load the suite's plugin (properties/_plugin/plugin.py), which brings
the prompt end of its xdist workers (properties/_plugin/prompt_exit.py) with it.

The plugin pins an xdist worker to its GPU when it is imported, before anything can
initialise CUDA. An installed copy of the suite loads the same plugin through its
``pytest11`` entry point instead (pyproject.toml turns that copy off in this repository).
"""

pytest_plugins = ["properties._plugin.plugin"]
