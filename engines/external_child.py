"""The child side of :class:`specfuzz.engines.external.ExternalEngine` (run as a script).

Run by another environment's interpreter as ``python -I external_child.py FD``: makes
``specfuzz`` importable from the folders in ``SPECFUZZ_PACKAGE_PATHS`` (the caller's own
source, so nothing is installed into the release environment), reads the engine spec,
its keyword arguments and the log path from the inherited connection ``FD``, then serves
the isolation layer's request loop (:func:`specfuzz.engines.isolation_child._child_main`).
Uses only the standard library until ``specfuzz`` is importable.
"""

import importlib.util
import json
import os
import pickle
import sys
from multiprocessing.connection import Connection


def _install_specfuzz(paths: list) -> None:
    init = os.path.join(paths[0], "__init__.py")
    spec = importlib.util.spec_from_file_location("specfuzz", init, submodule_search_locations=list(paths))
    module = importlib.util.module_from_spec(spec)
    sys.modules["specfuzz"] = module
    spec.loader.exec_module(module)


# At import, not only in main(): processes the engine spawns (vLLM's workers) import this
# file again as their __mp_main__ and may unpickle specfuzz objects. SPECFUZZ_SITE_DIRS:
# folders of a release unpacked without an installer (a bundle carried to a machine with no
# package index), searched before the interpreter's own site-packages.
for _d in reversed(json.loads(os.environ.get("SPECFUZZ_SITE_DIRS") or "[]")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
if "specfuzz" not in sys.modules and os.environ.get("SPECFUZZ_PACKAGE_PATHS"):
    _install_specfuzz(json.loads(os.environ["SPECFUZZ_PACKAGE_PATHS"]))


def main() -> None:
    conn = Connection(int(sys.argv[1]))
    engine_spec, kwargs, log_path = pickle.loads(conn.recv_bytes())
    from specfuzz.engines.isolation_child import _child_main

    _child_main(conn, engine_spec, kwargs, log_path)


if __name__ == "__main__":
    main()
