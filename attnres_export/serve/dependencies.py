"""The ``serve`` extra (PyTriton, tritonclient), imported only here and only when a serving command runs, and the
environment PyTriton's server needs.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from attnres_export.errors import AttnresError

SERVE_REQUIREMENTS = ("nvidia-pytriton>=0.7", "tritonclient[http,grpc]>=2.50", "aiohttp>=3.9", "ml-dtypes==0.5.4")
"""The ``serve`` extra of pyproject.toml (a test keeps the two equal). attnres-export is not on a package index,
so ``pip install attnres-export[serve]`` finds nothing: the hint installs these into this interpreter."""
NUMPY_NOTE = "every nvidia-pytriton release requires numpy<2, so this moves NumPy to 1.26 (docs/serving.md)"


def install_hint() -> str:
    """The command that installs the extra into the running interpreter's environment, and what it changes."""
    specs = " ".join(shlex.quote(r) for r in SERVE_REQUIREMENTS)
    return f"{shlex.quote(sys.executable)} -m pip install {specs} ({NUMPY_NOTE})"


class ServeError(AttnresError):
    """A model that cannot be served, a server that cannot start, or a repository that cannot be written."""


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` from the serve extra, or raise one line naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = exc.name or module
        raise ServeError(f"{what} needs the serve extra ({missing} is not installed): {install_hint()}") from exc


_MODEL_CONFIG: dict[str, ModuleType] = {}


def model_config_pb2() -> ModuleType:
    """Triton's model-config schema (``model_config_pb2`` as shipped in tritonclient), loaded from its file.

    Importing ``tritonclient.grpc`` itself would need grpcio; the schema module needs only protobuf."""
    if "module" in _MODEL_CONFIG:
        return _MODEL_CONFIG["module"]
    spec = importlib.util.find_spec("tritonclient")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / "grpc" / "model_config_pb2.py" for f in folders
                 if (Path(f) / "grpc" / "model_config_pb2.py").is_file()), None)
    if path is None:
        raise ServeError(f"checking a Triton config needs tritonclient's model_config_pb2 (the serve extra): "
                         f"{install_hint()}")
    module_spec = importlib.util.spec_from_file_location("attnres_export_triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # protobuf runtime too old or too new for the generated file
        raise ServeError(f"cannot load Triton's config schema {path} ({type(exc).__name__}: {exc}); install the "
                         f"versions the serve extra pins: {install_hint()}") from exc
    _MODEL_CONFIG["module"] = module
    return module


def python_library_dir() -> str | None:
    """The folder holding this interpreter's ``libpython3.X.so``, when the interpreter has one.

    PyTriton's Python-backend stub links ``libpython3.X.so.1.0``; the dynamic loader finds the system's copy
    first unless this interpreter's folder leads ``LD_LIBRARY_PATH`` (a pyenv, conda or venv-from-pyenv Python
    then runs the stub against another build of Python)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir or not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    name = f"libpython{sys.version_info.major}.{sys.version_info.minor}"
    folder = Path(libdir)
    if not folder.is_dir() or not any(folder.glob(f"{name}*.so*")):
        return None
    return str(folder)


def server_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with the interpreter's library folder first on LD_LIBRARY_PATH."""
    env = dict(os.environ if environ is None else environ)
    folder = python_library_dir()
    if folder is None:
        return env
    entries = [e for e in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if e and e != folder]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([folder, *entries])
    return env
