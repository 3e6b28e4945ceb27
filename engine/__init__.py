"""The engine that calls an implementation: ``--impl`` targets and Solution files, their declarations and knobs,
destination-passing calls, isolation in a child process (the sanitizer included) and containment of CUDA faults.
"""
