"""Replay a saved failure: ``python -m properties.repro FILE`` (see ``replay``), and the words it prints
(``diagnosis``)."""
