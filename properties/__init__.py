"""The properties: claims about any implementation of the contract, one test file per theme.

Each ``test_*.py`` property declares its claim beside it (``@claims.claim(...)``, ``claims.py``); ``checks.py`` holds
the assertions the claims are written in. Cases come from ``generation``; the plugin in ``runner`` runs them.
"""
