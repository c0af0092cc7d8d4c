"""The SQLite catalog: schema, connections and transactions.

One connection per operation (opened and closed around it) keeps the library safe to share
between threads (Streamlit sessions) and processes. The catalog runs in WAL mode so readers
never block the writer; writers take the write lock up front (``BEGIN IMMEDIATE``) and wait up
to ``BUSY_TIMEOUT_MS`` for another writer to finish.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

from gating_core.errors import CatalogVersionError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 30_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    patient_id TEXT REFERENCES patients(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,               -- events | labels | gate-result | model
    relpath TEXT NOT NULL UNIQUE,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    n_rows INTEGER,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS patients (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    name_key TEXT NOT NULL UNIQUE,    -- case-folded name: "P1" and "p1" are one patient
    created_at TEXT NOT NULL,
    n_events INTEGER NOT NULL,
    n_channels INTEGER NOT NULL,
    dtype TEXT NOT NULL,
    events_file TEXT NOT NULL,
    keywords_json TEXT NOT NULL,
    spillover_json TEXT,
    spillover_channels_json TEXT NOT NULL,
    fcs_version TEXT,
    compensated INTEGER NOT NULL,
    notes_json TEXT NOT NULL,         -- what the FCS reader tolerated (Sample.notes)
    current_labeling INTEGER
);
CREATE TABLE IF NOT EXISTS channels (
    patient_id TEXT NOT NULL REFERENCES patients(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    pnn TEXT NOT NULL,
    pns TEXT NOT NULL,
    range REAL,
    PRIMARY KEY (patient_id, position)
);
CREATE TABLE IF NOT EXISTS sources (
    id INTEGER PRIMARY KEY,
    patient_id TEXT NOT NULL REFERENCES patients(id) ON DELETE CASCADE,
    role TEXT NOT NULL,               -- fcs | labels | gated-csv | upload
    path TEXT NOT NULL,
    size INTEGER,
    sha256 TEXT
);
CREATE TABLE IF NOT EXISTS labelings (
    id INTEGER PRIMARY KEY,
    patient_id TEXT NOT NULL REFERENCES patients(id) ON DELETE CASCADE,
    provenance TEXT NOT NULL,
    source TEXT,
    model_id TEXT,
    gate_result_id INTEGER,
    labels_file TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS populations (
    labeling_id INTEGER NOT NULL REFERENCES labelings(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (labeling_id, name)
);
CREATE TABLE IF NOT EXISTS gate_sets (
    id INTEGER PRIMARY KEY,
    patient_id TEXT NOT NULL REFERENCES patients(id) ON DELETE CASCADE,
    gates_json TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    method TEXT,
    file_id TEXT NOT NULL,
    evaluation_json TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (name, version)
);
CREATE TABLE IF NOT EXISTS model_training_patients (
    model_id TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    patient_name TEXT NOT NULL,
    patient_id TEXT,                  -- kept as text: the patient may be removed later
    PRIMARY KEY (model_id, position)
);
CREATE TABLE IF NOT EXISTS gate_results (
    id INTEGER PRIMARY KEY,
    patient_id TEXT NOT NULL REFERENCES patients(id) ON DELETE CASCADE,
    model_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    counts_json TEXT NOT NULL,
    details_json TEXT NOT NULL,
    status TEXT NOT NULL,             -- pending | accepted
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    action TEXT NOT NULL,
    patient_id TEXT,
    patient_name TEXT,
    model_id TEXT,
    actor TEXT,
    details_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_patient ON audit(patient_id);
CREATE INDEX IF NOT EXISTS labelings_patient ON labelings(patient_id);
CREATE INDEX IF NOT EXISTS gate_results_patient ON gate_results(patient_id);
"""

# Tables added within a schema version: a program that does not know them ignores them (it reads
# and writes only its own tables, and their rows go with the files they point to), so a catalog
# that gains them stays readable by older copies of this program. Created where missing.
ADDED_TABLES = {
    # events_digest of an events file's events, computed when it is stored (or first asked for):
    # whether two patients hold the same events, whatever Parquet writer stored each.
    "events_digests": """
CREATE TABLE IF NOT EXISTS events_digests (
    file_id TEXT PRIMARY KEY REFERENCES files(id) ON DELETE CASCADE,
    digest TEXT NOT NULL
)""",
}


def connect(db_path: Path) -> sqlite3.Connection:
    """Open the catalog in autocommit mode (transactions are explicit) with WAL and FKs on."""
    conn = sqlite3.connect(str(db_path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    # FULL: a commit is on disk before we report success (the files it points to already are).
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def ensure_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL (persistent in the file). Retried: the switch can meet a busy lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() == "wal":
                return
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables on a new catalog; refuse a catalog written by a newer version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise CatalogVersionError(
            f"catalog schema version {version} is newer than this program's ({SCHEMA_VERSION}); "
            "update gating_core")
    if version < SCHEMA_VERSION:
        with write_transaction(conn):
            if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    _add_missing_tables(conn)


def _add_missing_tables(conn: sqlite3.Connection) -> None:
    def missing():
        present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return [name for name in ADDED_TABLES if name not in present]

    if missing():  # checked first, so opening a complete catalog takes no write lock
        with write_transaction(conn):
            for name in missing():
                conn.execute(ADDED_TABLES[name])


@contextmanager
def write_transaction(conn: sqlite3.Connection):
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolls back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:  # SQLite may already have rolled back (disk full, I/O error)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def read_transaction(conn: sqlite3.Connection):
    """A consistent snapshot across several SELECTs."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
