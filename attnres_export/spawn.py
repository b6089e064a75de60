"""The command lines that start this package's Python child processes, so that no code from the user's folder runs
in them (docs/security.md#nothing-untrusted-runs).

``python -m MODULE`` and ``python -c CODE`` put the working directory first on sys.path: a ``numpy.py`` in the
folder a command was run from (one that came with a foreign model, say) would run in place of NumPy.

- Code that needs only the standard library runs in isolated mode (``-I``: no working directory, PYTHONPATH or
  user site-packages).
- This package's modules run through ``BOOTSTRAP``, whose first statement takes the working directory off sys.path
  again (what ``-P`` does from Python 3.11 on), before anything is imported. The child then imports what its parent
  does (site-packages, the user's site-packages, PYTHONPATH: where ONNX Runtime or TensorRT may be installed) and
  loads ``attnres_export`` from the folder the parent loaded it from, installed or a checkout, and nothing else from
  that folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
"""This process's ``attnres_export``: the one its Python children run."""

BOOTSTRAP = """\
import sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
import importlib, importlib.util
package, module, *args = sys.argv[1:]
spec = importlib.util.spec_from_file_location("attnres_export", package + "/__init__.py",
                                              submodule_search_locations=[package])
sys.modules["attnres_export"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["attnres_export"])
sys.argv = [module, *args]
sys.exit(importlib.import_module(module).main(args))
"""
"""``python -c BOOTSTRAP PACKAGE_DIR MODULE ARGS...``: ``MODULE.main(ARGS)``, its return the exit status. Python
puts the working directory on sys.path (as "") after its start-up imports, just before this code runs."""


def python_code(code: str, *args: str) -> list[str]:
    """``python -c CODE ARGS`` in isolated mode, for code that needs only the standard library."""
    return [sys.executable, "-I", "-c", code, *args]


def python_main(module: str, *args: str) -> list[str]:
    """``MODULE.main(ARGS)`` of this package in a child that imports nothing from the working directory; its exit
    status is what ``main`` returns (1 with a traceback on stderr when the child fails before that, an import
    error say)."""
    return [sys.executable, "-c", BOOTSTRAP, str(PACKAGE_DIR), module, *args]
