"""The runner: the pytest plugin (``plugin``, its one entry) and xdist glue, GPU placement, MPS, shards, profiles,
the time budget and the prompt end of worker processes.
"""
