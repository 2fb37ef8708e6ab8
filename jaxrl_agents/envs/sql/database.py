"""The ``sql`` env's shop database: generated rows and the cached SQLite file.

The database (``customers``, ``products``, ``orders``; deterministic in ``db_seed``) is written once
per process per seed to ``$JAXRL_AGENTS_CACHE/sql`` (default ``~/.cache/jaxrl_agents/sql``), via a
temp file and an atomic rename, then chmod 0444. Each question's ground truth is computed from that
data when the task is made (``tests/envs/test_env_sql.py`` recomputes it with plain Python loops).
"""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import tempfile
import threading
from pathlib import Path

SCHEMA_VERSION = 1
CITIES = ("Avalon", "Brixton", "Corvel", "Dunmore", "Elston", "Fairhaven")
CATEGORIES = ("books", "garden", "kitchen", "toys", "sports")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_FIRST = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena")
_LAST = ("Stone", "Reyes", "Okafor", "Lind", "Moreau", "Tanaka", "Novak", "Quinn", "Hale", "Park")
_ADJ = ("Classic", "Compact", "Deluxe", "Eco", "Pro", "Smart")
_NOUN = {
    "books": ("Atlas", "Novel", "Cookbook"),
    "garden": ("Hose", "Rake", "Planter"),
    "kitchen": ("Kettle", "Blender", "Skillet"),
    "toys": ("Robot", "Puzzle", "Kite"),
    "sports": ("Racket", "Helmet", "Ball"),
}
_DDL = """
CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL,
                        signup_year INTEGER NOT NULL);
CREATE TABLE products (product_id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                       price REAL NOT NULL);
CREATE TABLE orders (order_id INTEGER PRIMARY KEY,
                     customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
                     product_id INTEGER NOT NULL REFERENCES products(product_id),
                     quantity INTEGER NOT NULL, order_date TEXT NOT NULL);
"""


def generate_rows(db_seed: int) -> dict[str, list[tuple]]:
    """The database content: ``{table: rows}``, a pure function of ``db_seed``."""
    rng = random.Random(f"sql-db/{db_seed}")
    names = rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], 60)
    customers = [
        (i + 1, n, rng.choice(CITIES), rng.randint(2018, 2023)) for i, n in enumerate(names)
    ]
    pnames = rng.sample([(f"{a} {n}", c) for c in CATEGORIES for n in _NOUN[c] for a in _ADJ], 30)
    products = [(i + 1, n, c, round(rng.uniform(3, 250), 2)) for i, (n, c) in enumerate(pnames)]
    orders = []
    for i in range(600):
        month, day = rng.randint(1, 12), rng.randint(1, 28)
        orders.append(
            (
                i + 1,
                rng.randint(1, 60),
                rng.randint(1, 30),
                rng.randint(1, 5),
                f"2023-{month:02d}-{day:02d}",
            )
        )
    return {"customers": customers, "products": products, "orders": orders}


_built: dict[int, Path] = {}
_build_lock = threading.Lock()


def cache_dir() -> Path:
    root = os.environ.get("JAXRL_AGENTS_CACHE") or Path.home() / ".cache" / "jaxrl_agents"
    return Path(root) / "sql"


def database_path(db_seed: int = 0) -> Path:
    """Path of the seed's database file, writing it on the first call in this process."""
    with _build_lock:
        if db_seed in _built:
            return _built[db_seed]
        out = cache_dir()
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"shop-v{SCHEMA_VERSION}-seed{db_seed}.sqlite"
        fd, tmp = tempfile.mkstemp(dir=out, suffix=".tmp")
        os.close(fd)
        try:
            conn = sqlite3.connect(tmp)
            conn.executescript(_DDL)
            for table, rows in generate_rows(db_seed).items():
                conn.executemany(
                    f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})", rows
                )
            conn.commit()
            conn.close()
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)  # atomic: concurrent processes never see a partial file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _built[db_seed] = path
        return path


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
