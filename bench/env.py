"""The bench's environment: MariaDB started and its own database migrated, Django configured for it.

`prepare()` must run before Django is set up (it sets the process environment that `config.settings`
reads). The bench runs with `DEBUG=false` (production settings: no per-query logging in
`connection.queries`, real encryption keys) on a database of its own, `diagnosis_bench` by default, so it
never touches the development database or a test database.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "diagnosis_bench"
HOST, PORT, USER = "127.0.0.1", 3306, "root"


def ensure_mariadb() -> None:
    """Start MariaDB through the project's script if it does not answer."""
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh")], check=True)


def raw_connect(database: str | None = None, *, autocommit: bool = True):
    """A plain MySQLdb connection with the same session settings as Django's (charset, sql_mode) and the
    same value conversions (`core.mysql_conversions`: a floor that parsed date-times more slowly than the
    product does would flatter the product's ratio)."""
    import MySQLdb

    from core.mysql_conversions import conversions

    kwargs = {"host": HOST, "port": PORT, "user": USER, "charset": "utf8mb4", "conv": conversions()}
    if database:
        kwargs["database"] = database
    conn = MySQLdb.connect(**kwargs, local_infile=1)
    conn.autocommit(autocommit)
    cur = conn.cursor()
    cur.execute(
        "SET sql_mode='STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
        "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', collation_connection='utf8mb4_unicode_ci'"
    )
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cur.close()
    return conn


def create_database(name: str) -> None:
    conn = raw_connect()
    try:
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
    finally:
        conn.close()


def bench_key_path() -> Path:
    """The bench's signing key: per user and machine (`$XDG_DATA_HOME/diagnosis-bench/`, by default
    `~/.local/share/diagnosis-bench/`), like the bench databases it signs."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "diagnosis-bench" / "audit-signing.key"


def prepare(database: str = DEFAULT_DB) -> None:
    """Environment for `config.settings` before `django.setup()`: MariaDB, production mode, bench keys."""
    from cryptography.fernet import Fernet

    os.environ["DATABASE_URL"] = f"mysql://{USER}@{HOST}:{PORT}/{database}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DEBUG"] = "false"
    os.environ.setdefault("SECRET_KEY", "bench-" + Fernet.generate_key().decode())
    os.environ.setdefault("REASONING_ENCRYPTION_KEYS", Fernet.generate_key().decode())
    # One signing key for every bench run on this machine, so that the checkpoints of the kept B5
    # databases still verify in later runs. It lives beside what it signs: the databases belong to the
    # machine's MariaDB, not to a checkout, so a key kept in the checkout made a fresh clone's first
    # `make bench` refuse the datasets an earlier clone had built ("the transparency log has 1 problem").
    from audit.transparency.keys import generate_key_text, validate_private
    from core.devkeys import read_or_create

    os.environ.setdefault(
        "AUDIT_SIGNING_KEYS",
        read_or_create(
            bench_key_path(),
            generate=generate_key_text,
            validate=validate_private,
            what="an Ed25519 key",
        ),
    )
    # Likewise one write key (core.writeauth): the kept datasets' tags must keep verifying.
    from core import writeauth

    os.environ.setdefault(
        "AUDIT_WRITE_KEYS",
        read_or_create(
            bench_key_path().with_name("audit-write.key"),
            generate=writeauth.generate_key_text,
            validate=writeauth.parse_key,
            what="a write key",
        ),
    )
    os.environ["SECURE_SSL_REDIRECT"] = "false"
    # B3's clients reach daphne on loopback without TLS (a deployment terminates TLS at its proxy).
    os.environ["WEBSOCKET_REQUIRE_TLS"] = "false"
    os.environ["ALLOWED_HOSTS"] = "127.0.0.1,localhost,testserver"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # Persistent connections, as a server would run: with 0, Django closes the connection at the end of
    # every request and the next request pays a new connection.
    os.environ.setdefault("DB_CONN_MAX_AGE", "300")
    for name in ("REDIS_URL", "LLM_API_KEY", "LLM_PROVIDER"):
        os.environ.pop(name, None)


def setup(database: str = DEFAULT_DB, *, migrate: bool = True) -> None:
    """Start MariaDB if needed, create and migrate `database`, and set Django up on it."""
    ensure_mariadb()
    create_database(database)
    prepare(database)
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_gib: float
    cpu_model: str
    python: str
    django: str
    mariadb: str
    mysqlclient: str
    innodb: str
    platform: str
    idle: tuple[float, float] = (0.0, 0.0)  # `idle_penalty()`: µs of CPU back to back, after 300 ms idle

    def lines(self) -> list[str]:
        busy, after = self.idle
        return [
            f"- cores: {self.cores}; memory: {self.memory_gib:.1f} GiB; CPU: {self.cpu_model}",
            f"- {self.platform}",
            f"- the same small unit of work (a Fernet encryption, a canonical JSON, a SHA-256) costs "
            f"{after:.0f} µs of CPU right after 300 ms idle against {busy:.0f} µs back to back "
            f"({after / max(busy, 1e-9):.1f}×; `bench.env.idle_penalty`): B4 and B7 wait 300 ms for each "
            f"model call, and their overhead is the work after each wait",
            f"- Python {self.python}, Django {self.django}, mysqlclient {self.mysqlclient}",
            f"- MariaDB {self.mariadb} on loopback TCP ({self.innodb})",
        ]


def idle_penalty(samples: int = 15, idle: float = 0.3) -> tuple[float, float]:
    """(µs of CPU of one small unit of work run back to back, µs of the same right after `idle` seconds
    asleep), medians. A virtual machine whose idle CPUs are given away or slowed pays for it in the
    first work after each wait: B4's and B7's runs wait 300 ms for every model call."""
    import json
    import statistics

    from cryptography.fernet import Fernet

    fernet = Fernet(Fernet.generate_key())
    document = {f"k{i}": ["v" * 20, i, {"x": i}] for i in range(200)}

    def unit() -> float:
        started = time.thread_time()
        fernet.encrypt(b"x" * 75)
        json.dumps(document, sort_keys=True, separators=(",", ":"))
        hashlib.sha256(b"y" * 5000).hexdigest()
        return (time.thread_time() - started) * 1e6

    unit()
    busy = statistics.median(unit() for _ in range(samples))
    after = []
    for _ in range(samples):
        time.sleep(idle)
        after.append(unit())
    return busy, statistics.median(after)


def machine() -> Machine:
    """What this machine and its software are (read after `setup`)."""
    import MySQLdb
    from django import get_version
    from django.db import connection

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 1024 / 1024
                break
    except OSError:
        pass
    with connection.cursor() as cur:
        cur.execute(
            "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@innodb_buffer_pool_size, @@log_bin"
        )
        version, flush, pool, log_bin = cur.fetchone()
    innodb = (
        f"innodb_flush_log_at_trx_commit={flush}, buffer pool {int(pool) // 2**20} MiB, "
        f"binary log {'on' if log_bin else 'off'}"
    )
    return Machine(
        cores=os.cpu_count() or 0,
        memory_gib=mem,
        cpu_model=cpu,
        python=platform.python_version(),
        django=get_version(),
        mariadb=version,
        mysqlclient=".".join(str(p) for p in MySQLdb.version_info[:3]),
        innodb=innodb,
        platform=f"{platform.system()} {platform.release()} ({sys.implementation.name})",
        idle=idle_penalty(),
    )


def spawn_worker(module: str, args: list[str], *, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """`python -m MODULE ARGS…`: a bench's worker process (its own Django set-up, its own database
    settings in `env`), whose last line of output is its JSON result (`worker_result`)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=str(cwd),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker_result(proc: subprocess.Popen, timeout: float, *, name: str) -> dict:
    """The JSON result a worker printed last; its error output when it failed."""
    import json

    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} worker failed ({proc.returncode}): {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])
