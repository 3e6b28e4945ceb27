"""The record of a run: case files, their replay (``python -m gqa_decode_fuzz.record.repro FILE``), crashes
replayed alone under MPS, root causes and the run report.
"""
