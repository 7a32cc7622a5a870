"""Cache folders that always work: created on demand and writable, else a temporary stand-in.

A read-only, missing-and-uncreatable or file-shaped cache location is a `CacheWarning` (once per
location and process), never an OSError from deep inside a build.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import warnings
from pathlib import Path

from mugraph.ir.errors import CacheWarning

_USABLE: dict[tuple[Path, str], Path] = {}
_LOCK = threading.Lock()


def usable_dir(path, purpose: str) -> Path:
    """`path`, created if needed, when this process can write there; else a folder under the
    system's temporary directory, with one CacheWarning naming `path`, the reason and the fix."""
    path = Path(path)
    with _LOCK:
        if (path, purpose) in _USABLE:
            return _USABLE[path, purpose]
    reason = _unwritable(path)
    chosen = path
    if reason is not None:
        chosen = _fallback(path)
        warnings.warn(f"cache folder {str(path)!r} for {purpose} is unusable ({reason}); "
                      f"using {str(chosen)!r} for this process instead (set MUGRAPH_CACHE_DIR to a "
                      "writable folder to keep results between runs)", CacheWarning, stacklevel=3)
    with _LOCK:
        return _USABLE.setdefault((path, purpose), chosen)


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot serve as a cache folder, or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "a file is in the way"
    except NotADirectoryError:
        return "part of the path is a file"
    except OSError as e:
        return e.strerror or type(e).__name__
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as e:
        return f"not writable: {e.strerror or type(e).__name__}"
    return None


def _fallback(path: Path) -> Path:
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    user = os.getuid() if hasattr(os, "getuid") else "user"
    folder = Path(tempfile.gettempdir()) / f"mugraph-{user}" / f"{tag}-{path.name or 'cache'}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def forget() -> None:
    """Check every location again on next use (tests change permissions)."""
    with _LOCK:
        _USABLE.clear()
