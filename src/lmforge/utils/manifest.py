"""File manifests: each file's size and sha256, written with a folder and checked when it is read.

A model folder's ``manifest.json`` lets a load catch a flipped byte or a truncated file before the
weights reach a model (safetensors checks only its header). Sizes are compared first: a truncated or
replaced file is caught without hashing it.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.bin").write_bytes(b"weights")
    >>> files = file_entries(folder)
    >>> files["a.bin"]["bytes"]
    7
    >>> _ = (folder / "a.bin").write_bytes(b"weightz")
    >>> try:
    ...     check_files(folder, files)
    ... except IntegrityError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    sha256 differs from the manifest (the file was altered or damaged)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from lmforge.errors import IntegrityError

MANIFEST_FILE = "manifest.json"


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entries(folder: str | Path, exclude: tuple[str, ...] = (MANIFEST_FILE,)) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` for every file below ``folder``."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in exclude}


def check_files(folder: str | Path, files: dict[str, dict[str, Any]]) -> None:
    """Raise :class:`IntegrityError` naming the first file that is missing or differs from ``files``."""
    folder = Path(folder)
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            raise IntegrityError(f"{path}: listed in the manifest but missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise IntegrityError(f"{path}: {size} bytes, the manifest says {want['bytes']} (truncated or replaced)")
        if sha256_file(path) != want["sha256"]:
            raise IntegrityError(f"{path}: sha256 differs from the manifest (the file was altered or damaged)")
