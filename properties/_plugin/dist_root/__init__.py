"""gqa_decode_fuzz: the suite as installed (``pip install``), its packages under one name.

In the repository these are the top-level folders ``kernel``, ``reference``,
``properties`` and ``adapters``; installed, they are ``gqa_decode_fuzz.kernel`` and
so on (pyproject.toml maps them), so they clash with no other project's packages.
This file becomes the installed ``gqa_decode_fuzz/__init__.py``.
"""
