"""Files that appear whole or not at all: written under a temporary name beside their place and moved in with
one rename, so a reader (or a crash) never sees half a file: a sweep's results and journal, and the manifest
`plot` updates. Files that belong together (a run's, a job's, a study's, a search's) move in as one folder
instead (report/run_folder.py)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_through_temporary(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a fresh temporary file beside ``path`` (same folder, so the rename stays on one file
    system), then move it into place; on any error the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file moved into place."""
    write_through_temporary(path, lambda tmp: tmp.write_bytes(data))
