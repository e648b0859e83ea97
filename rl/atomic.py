"""Write-then-rename: everything a run writes for the user (checkpoints, the adapter, jsonl dumps, metrics) is
built under a temporary name beside its final path and renamed into place only when complete, so a crash or a
kill never leaves a file or folder that looks finished but is not."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write a file; `durable`: fsync it before returning (a checkpoint's files)."""
    with open(path, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())


@contextmanager
def replace_when_done(final: Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield `.<name>.tmp` beside `final` for the block to create (a file or a folder); when the block completes,
    it replaces `final`. If the block raises (or the process dies), `final` is left as it was and the temporary path
    stays for inspection until the next write removes it.
    `durable`: the temporary folder and, after the rename, the parent folder are fsynced (files are the caller's,
    with `write_bytes(durable=True)`)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    _remove(tmp)  # left by a run killed while writing
    yield tmp
    if durable and tmp.is_dir():
        fsync_dir(tmp)
    if final.is_dir():  # os.replace cannot replace a non-empty folder
        shutil.rmtree(final)
    os.replace(tmp, final)
    if durable:
        fsync_dir(final.parent)


@contextmanager
def atomic_jsonl(path: Path) -> Iterator[IO[str]]:
    """A line-buffered text file written under a temporary name and renamed to `path` when the block completes."""
    with replace_when_done(path) as tmp, tmp.open("w", buffering=1) as f:
        yield f
