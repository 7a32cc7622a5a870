"""The result cache: finished searches and search checkpoints in one SQLite file (WAL journal, so
several processes may read and write it at once), keyed by everything that affects the answer.

Key: the spec's structural hash, the search config (all but `workers` and the budgets, which say
how long to look, not what for: `search.cached` decides whether a stored search serves another
budget or is continued), the target, mugraph's version and source digest, and the toolchain's
versions. Value: the winner's graph JSON, the
pickled search result (report and ranked candidates), the report text, and the generated CUDA and
CUBIN per arch. A caller re-verifies an entry before trusting it (`search.cached`); an entry that
cannot be read is reported once (CacheWarning) and rebuilt; a damaged database file is moved aside.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import pickle
import re
import sqlite3
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from mugraph.ir.cache_dir import usable_dir
from mugraph.ir.errors import CacheWarning, InvalidInput

SCHEMA = 1
FILE_NAME = "results.sqlite"
_TABLES = (
    """CREATE TABLE IF NOT EXISTS results (
        key TEXT PRIMARY KEY, spec TEXT NOT NULL, inputs TEXT NOT NULL, target TEXT NOT NULL,
        config TEXT NOT NULL, versions TEXT NOT NULL, created REAL NOT NULL,
        graph TEXT NOT NULL, result BLOB NOT NULL, summary TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sources (
        key TEXT NOT NULL, arch TEXT NOT NULL, source TEXT NOT NULL, cubin BLOB,
        PRIMARY KEY (key, arch))""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        key TEXT PRIMARY KEY, saved REAL NOT NULL, state BLOB NOT NULL, note TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS buckets (
        bucket TEXT NOT NULL, key TEXT NOT NULL, spec TEXT NOT NULL, shapes TEXT NOT NULL,
        created REAL NOT NULL, PRIMARY KEY (bucket, key))""",
)


@dataclass(frozen=True)
class Entry:
    """One finished search as stored: plain values, readable without unpickling anything."""

    key: str
    spec: str           # the spec's digest
    inputs: str         # e.g. "X:f16[16,256] W:f16[256,384]"
    target: str
    config: str         # SearchConfig JSON
    versions: str       # JSON of the versions in the key
    created: float
    graph: str          # the winner's graph JSON
    result: bytes       # the pickled SearchResult
    summary: str        # the report text

    @property
    def stop_reason(self) -> str:
        """Why the stored search stopped (exhausted, time, states, ...), from its report."""
        found = re.match(r"stop reason: (.+?) after", self.summary)
        return found.group(1) if found else ""

    @property
    def budget(self) -> tuple[float, int]:
        """(budget_seconds, budget_states) the stored search ran under."""
        config = json.loads(self.config)
        return config["budget_seconds"], config["budget_states"]


class CorruptEntry(Exception):
    """An entry that cannot be used as stored (unreadable, or not what its key says)."""


# ---- keys ------------------------------------------------------------------------------------------
@functools.cache
def source_digest() -> str:
    """A hash of mugraph's own source (Python files and the CUDA runtime headers)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for folder in ("mugraph", "ir", "search", "verify", "codegen"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".cuh", ".h", ".cc") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def versions() -> dict:
    """Everything outside the spec and config that can change a search's answer."""
    found = {"mugraph": _version("mugraph"), "source": source_digest()}
    for name in ("jax", "jaxlib", "numpy", "z3-solver", "nvidia-cuda-nvrtc", "cuda-bindings"):
        found[name] = _version(name)
    return found


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


# Config fields that are not in the key: executors agree on the answer, and the budgets bound how
# long a search looks, not what it looks for (a stored search serves an equal or smaller budget,
# and a larger one continues it: search/cached.py).
NOT_IN_KEY = ("workers", "budget_seconds", "budget_states")


def _key_config(config) -> dict:
    settings = json.loads(config.to_json())
    for name in NOT_IN_KEY:
        settings.pop(name, None)
    return settings


def bucket_key(spec, config) -> str:
    """The key of a shape bucket: the same as `search_key` with the spec's extents left out."""
    from mugraph.search.buckets import structure_digest
    text = json.dumps({"schema": SCHEMA, "structure": structure_digest(spec),
                       "config": _key_config(config), "target": config.target,
                       "versions": versions()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def search_key(spec, config) -> str:
    """The cache key of searching `spec` under `config` (without the fields in NOT_IN_KEY)."""
    text = json.dumps({"schema": SCHEMA, "spec": spec.digest(), "config": _key_config(config),
                       "target": config.target, "versions": versions()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def describe_inputs(spec) -> str:
    return " ".join(f"{n.arg[0]}:{n.dtype.short}{list(n.shape)}".replace(" ", "")
                    for n in spec.inputs)


# ---- the database ----------------------------------------------------------------------------------
class ResultCache:
    """The SQLite file under `folder` (default: `$MUGRAPH_CACHE_DIR`); an unusable folder falls
    back to a temporary one with a CacheWarning."""

    def __init__(self, folder=None):
        if folder is None:
            from mugraph.ir.settings import settings
            folder = settings.cache_dir
        self.folder = usable_dir(folder, "search results")
        self.path = self.folder / FILE_NAME
        self._local = threading.local()
        self._warned: set = set()

    # -- connection --
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._open()
            self._local.db = db
        return db

    def _open(self) -> sqlite3.Connection:
        try:
            return _connect(self.path)
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as e:
            self._set_aside(e)
            return _connect(self.path)

    def _set_aside(self, error: Exception) -> None:
        """Move a damaged database file aside (kept for inspection) and start an empty one."""
        self.close()
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.time_ns()}")
        try:
            self.path.replace(aside)
        except FileNotFoundError:
            pass
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.warn_once("damaged", f"the result cache {str(self.path)!r} was unreadable ({error}); "
                                  f"moved it to {aside.name} and started an empty one")

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def _run(self, sql: str, args=()) -> list:
        """Rows of one statement in its own transaction. The cache is an aid, never a failure: a
        damaged file is set aside and the statement retried on a fresh one; a file that cannot be
        written (read-only, disk full, locked past the timeout) is warned about once and the
        statement answers nothing."""
        for attempt in range(2):
            try:
                db = self._db()
                with db:
                    return db.execute(sql, args).fetchall()
            except sqlite3.OperationalError as e:
                self.warn_once("unwritable", f"the result cache {str(self.path)!r} cannot be used "
                                             f"({e}); results are not cached in this process")
                return []
            except sqlite3.DatabaseError as e:
                if attempt:
                    raise
                self._set_aside(e)
        return []

    # -- results --
    def load(self, key: str) -> Entry | None:
        rows = self._run(f"SELECT {_COLUMNS} FROM results WHERE key = ?", (key,))
        return Entry(*rows[0]) if rows else None

    def store(self, entry: Entry) -> None:
        self._run(f"INSERT OR REPLACE INTO results ({_COLUMNS}) VALUES ({_MARKS})",
                  tuple(getattr(entry, c) for c in _COLUMN_NAMES))

    def delete(self, key: str) -> None:
        for table in ("results", "sources", "buckets"):
            self._run(f"DELETE FROM {table} WHERE key = ?", (key,))

    def entries(self) -> list[Entry]:
        rows = self._run(f"SELECT {_COLUMNS} FROM results ORDER BY created")
        return [Entry(*r) for r in rows]

    def find(self, prefix: str) -> Entry:
        """The one entry whose key starts with `prefix`; InvalidInput naming the choices else."""
        if not prefix or not all(c in "0123456789abcdef" for c in prefix):
            raise InvalidInput(f"{prefix!r} is not a cache key (hex digits)",
                               hint="`mugraph cache list` shows the keys")
        rows = self._run(f"SELECT {_COLUMNS} FROM results WHERE key LIKE ?", (prefix + "%",))
        if len(rows) != 1:
            keys = [r[0][:12] for r in self._run("SELECT key FROM results")]
            what = "no entry" if not rows else f"{len(rows)} entries"
            raise InvalidInput(f"{what} with a key starting {prefix!r}",
                               hint=f"keys: {', '.join(keys) or '(the cache is empty)'}")
        return Entry(*rows[0])

    def clear(self) -> int:
        count = self._run("SELECT COUNT(*) FROM results")[0][0]
        for table in ("results", "sources", "checkpoints", "buckets"):
            self._run(f"DELETE FROM {table}")
        return count

    # -- generated code --
    def store_source(self, key: str, arch: str, source: str, cubin: bytes | None) -> None:
        self._run("INSERT OR REPLACE INTO sources (key, arch, source, cubin) VALUES (?, ?, ?, ?)",
                  (key, arch, source, cubin))

    def sources(self, key: str) -> dict:
        """arch -> (CUDA source, CUBIN or None)."""
        rows = self._run("SELECT arch, source, cubin FROM sources WHERE key = ?", (key,))
        return {arch: (source, cubin) for arch, source, cubin in rows}

    # -- shape buckets --
    def add_to_bucket(self, bucket: str, key: str, spec_json: str, shapes: str) -> None:
        self._run("INSERT OR REPLACE INTO buckets (bucket, key, spec, shapes, created) "
                  "VALUES (?, ?, ?, ?, ?)", (bucket, key, spec_json, shapes, time.time()))

    def bucket(self, bucket: str) -> list[tuple[str, str, str]]:
        """(key, spec JSON, shapes) of the searches in a bucket, the latest first."""
        return self._run("SELECT key, spec, shapes FROM buckets WHERE bucket = ? "
                         "ORDER BY created DESC", (bucket,))

    # -- checkpoints --
    def save_checkpoint(self, key: str, state: bytes, note: str) -> None:
        self._run("INSERT OR REPLACE INTO checkpoints (key, saved, state, note) VALUES (?, ?, ?, ?)",
                  (key, time.time(), state, note))

    def checkpoint(self, key: str) -> tuple[float, bytes, str] | None:
        rows = self._run("SELECT saved, state, note FROM checkpoints WHERE key = ?", (key,))
        return rows[0] if rows else None

    def drop_checkpoint(self, key: str) -> None:
        self._run("DELETE FROM checkpoints WHERE key = ?", (key,))

    def checkpoints(self) -> list[tuple[str, float, str]]:
        return self._run("SELECT key, saved, note FROM checkpoints ORDER BY saved")

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, CacheWarning, stacklevel=3)


_COLUMN_NAMES = ("key", "spec", "inputs", "target", "config", "versions", "created", "graph",
                 "result", "summary")
_COLUMNS = ", ".join(_COLUMN_NAMES)
_MARKS = ", ".join("?" for _ in _COLUMN_NAMES)


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), timeout=60.0, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA busy_timeout = 60000")
        if db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() == "wal":
            db.execute("PRAGMA synchronous = NORMAL")  # WAL stays consistent; a cache may lose the last write on power loss
        else:
            db.execute("PRAGMA journal_mode = DELETE")  # a file system without shared memory
        for sql in _TABLES:
            db.execute(sql)
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


# ---- entries from results --------------------------------------------------------------------------
def make_entry(key: str, spec, config, result) -> Entry:
    from mugraph.ir.serialize import to_json
    return Entry(key=key, spec=spec.digest(), inputs=describe_inputs(spec), target=config.target,
                 config=config.to_json(), versions=json.dumps(versions(), sort_keys=True),
                 created=time.time(), graph=to_json(result.best, indent=None),
                 result=result_blob(result), summary=result.summary())


def result_blob(result) -> bytes:
    """The pickled result behind its sha256, so damage shows without unpickling."""
    data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(data).digest() + data


def read_entry(entry: Entry, spec) -> "StoredResult":
    """The result an entry holds, checked (its checksum, its graph JSON against the spec's
    interface) without unpickling it; CorruptEntry says why it cannot be used."""
    from mugraph.ir.serialize import from_json
    from mugraph.verify import interface_mismatch
    blob = entry.result
    if not isinstance(blob, bytes) or len(blob) < 33 or \
            hashlib.sha256(blob[32:]).digest() != blob[:32]:
        raise CorruptEntry("unreadable (its stored result does not match its checksum)")
    try:
        graph = from_json(entry.graph)
    except Exception as e:  # any damage to the JSON
        raise CorruptEntry(f"unreadable ({type(e).__name__}: {e})") from None
    if entry.spec != spec.digest():
        raise CorruptEntry("it was stored for another spec")
    mismatch = interface_mismatch(spec, graph)
    if mismatch:
        raise CorruptEntry(f"its graph does not fit the spec: {mismatch}")
    return StoredResult(graph, blob[32:], entry.key)


class StoredResult:
    """A SearchResult from the cache, unpickled on first use of anything but `.best` (its report
    and candidates bring in the verifier and the cost model, which a cache hit does not need)."""

    def __init__(self, best, data: bytes, key: str):
        self.best, self._data, self._key, self._result = best, data, key, None

    def load(self):
        if self._result is None:
            from mugraph.ir.errors import MugraphError
            try:
                result = pickle.loads(self._data)
            except Exception as e:
                raise MugraphError(f"result cache entry {self._key[:12]} cannot be read: "
                                   f"{type(e).__name__}: {e}",
                                   hint="`mugraph cache clear` and search again") from None
            if result.best is not self.best:
                raise MugraphError(f"result cache entry {self._key[:12]} holds a result for "
                                   "another graph than its own", hint="`mugraph cache clear`")
            self._result = result
        return self._result

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.load(), name)
