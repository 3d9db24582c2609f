"""Templates of the repro.py scripts ``specfuzz draft`` writes (rendered by :mod:`specfuzz.fuzz.draft.repro`).

Each file is a Python module that imports and lints on its own. What a script is made of
starts at a file's "repro.py begins" line; the lines above it (imports of the names the
part uses from the other parts) exist for linting and testing the file alone.
"""
