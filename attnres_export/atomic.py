"""Atomic file writes: a crash, Ctrl-C or SIGTERM never leaves a half-written file that looks valid, and never
leaves debris that the next run to the same output does not clean up (docs/security.md).

Temporary files and folders live beside their output and are named ``.<output name>.<pid>.<random>``: a later run
to the same output removes those whose process is gone. Creating one and arming its cleanup happens with SIGINT
and SIGTERM blocked, so an interrupt cannot fall between the two.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from attnres_export.errors import AttnresError

_DEFERRED = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends (they are delivered right after it)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files and folders that killed runs to ``path`` left beside it."""
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.")
    if not path.parent.is_dir():
        return
    for entry in path.parent.iterdir():
        found = pattern.match(entry.name)
        if found is None or _alive(int(found.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def temporary_dir_beside(path: Path) -> Iterator[Path]:
    """A private folder beside ``path`` (same filesystem, so its files can be renamed into place), removed at the
    end whatever happens."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    folder = None
    try:
        with deferred_signals():
            folder = Path(tempfile.mkdtemp(prefix=_prefix(path), dir=path.parent))
        yield folder
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def scratch_file_beside(path: Path, suffix: str) -> Iterator[Path]:
    """A private file beside ``path`` for a helper to read (never renamed into place), removed at the end
    whatever happens; a killed run's is removed by the next run to ``path``."""
    path = Path(path)
    remove_stale_temporaries(path)
    scratch = None
    try:
        with deferred_signals():
            fd, name = tempfile.mkstemp(prefix=_prefix(path), suffix=suffix, dir=path.parent)
            os.close(fd)
            scratch = Path(name)
        yield scratch
    finally:
        if scratch is not None:
            scratch.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only when the block succeeds."""
    path = Path(path)
    refuse_non_regular(path, "output")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = None
    try:
        with deferred_signals():
            fd, tmp_name = tempfile.mkstemp(prefix=_prefix(path), suffix=".tmp", dir=path.parent)
            os.close(fd)
            tmp = Path(tmp_name)
        os.chmod(tmp, default_file_mode())
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def default_file_mode() -> int:
    """The mode a plain ``open()`` would give a new file under the current umask."""
    return 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(text)


def refuse_non_regular(path: Path, option: str) -> None:
    """An output must be a regular file (or not exist yet): renaming over a device node, a folder or a pipe
    would replace it, and writing into one reports success for data that went nowhere."""
    if (path.exists() and not path.is_file()) or (path.is_symlink() and not path.resolve().is_file()):
        raise AttnresError(f"{option} {path} is not a regular file (a device, folder, pipe or dangling link); "
                           "write to a file path")


def check_outputs(outputs: Mapping[str, Path | None], inputs: Mapping[str, Path | None],
                  folders: Mapping[str, Path | None] | None = None) -> None:
    """Refuse, before any work, outputs that are not regular files, whose folder cannot be made or written, or that
    alias an input (a folder input: any file in it, so its weights or config are never overwritten) or each other.

    ``folders`` are output folders (``--genai DIR`` and its ``.failed`` copy): each must be a folder or not exist
    yet, and no input or other output may lie inside one (``--report DIR/genai_config.json`` would replace a file
    the folder holds). Keys are the option names shown in messages (``-o``, ``--report``, ``MODEL``)."""
    given_outputs = {name: Path(p) for name, p in outputs.items() if p is not None}
    given_folders = {name: Path(p) for name, p in (folders or {}).items() if p is not None}
    for name, path in given_outputs.items():
        refuse_non_regular(path, name)
        _refuse_unwritable_folder(path, name)
    for name, folder in given_folders.items():
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise AttnresError(f"{name} {folder} is not a folder (a file or a link); choose a folder path")
        _refuse_unwritable_folder(folder, name)
    given_inputs = [(n, Path(p)) for n, p in inputs.items() if p is not None]
    made_of = [(f"{n} (its file {f.name})", f) for n, p in given_inputs if p.is_dir()
               for f in sorted(p.iterdir()) if f.is_file()]
    seen: dict[Path, str] = {}
    for name, path in [*given_inputs, *made_of]:
        seen.setdefault(path.resolve(), name)  # inputs may share a file (a folder's link to its own file)
    for name, path in given_outputs.items():
        key = path.resolve()
        if key in seen:
            raise AttnresError(f"{name} {path} is the same file as {seen[key]}; choose another path (an output "
                               "never replaces an input or another output)")
        seen[key] = name
    _refuse_inside_folders(given_folders, given_inputs, given_outputs)


def _refuse_inside_folders(folders: Mapping[str, Path], inputs: list[tuple[str, Path]],
                           outputs: Mapping[str, Path]) -> None:
    """No input, other output or other output folder lies inside an output folder (or is it)."""
    for name, folder in folders.items():
        key = folder.resolve()
        for input_name, path in inputs:
            if path.resolve().is_relative_to(key):
                raise AttnresError(f"{name} {folder} holds {input_name} {path}; choose a folder outside it")
        others = [*outputs.items(), *((n, f) for n, f in folders.items() if n != name)]
        for other, path in others:
            if path.resolve().is_relative_to(key):
                raise AttnresError(f"{other} {path} is inside {name} {folder}, which this command writes; choose a "
                                   f"{other} path outside it")


def _refuse_unwritable_folder(path: Path, option: str) -> None:
    """The folder of ``path`` exists and takes new entries, or can be made: else the command would fail only after
    its work, perhaps after an earlier output was renamed into place. Probed by making and removing a
    temporary folder in the nearest existing ancestor (permission bits do not tell what root, a read-only mount
    or /proc allows)."""
    ancestor = path.absolute().parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise AttnresError(f"{option} {path}: its folder cannot be made ({ancestor} is a file or a dangling link); "
                           "choose a path in a folder")
    try:
        with deferred_signals():
            os.rmdir(tempfile.mkdtemp(prefix=_prefix(path), dir=ancestor))
    except OSError as exc:
        raise AttnresError(f"{option} {path}: cannot write in {ancestor} ({exc.strerror}); choose a path in a "
                           "folder you can write") from None
