"""Replay a saved failure: ``python -m gqa_decode_fuzz.record.repro FILE`` (see ``replay``), and the words it prints
(``diagnosis``)."""
