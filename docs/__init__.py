"""The JSON schemas of specfuzz's machine-readable output, shipped as ``specfuzz.schemas``.

``results-schema.json``: ``specfuzz fuzz|replay --json FILE``; ``triage-schema.json``:
``specfuzz triage --json``. Read them with ``importlib.resources.files("specfuzz.schemas")``.
"""
