"""Database errors that leave a write's outcome unknown, and the connection handling after them.

A lost connection (2006 gone away, 2013 lost during the query, 2055 lost at handshake: a server killed,
or a failover behind a proxy) or a Galera certification conflict (1213 "WSREP detected deadlock/conflict":
the transaction rolled back whole) says nothing of whether a write landed. Whoever retries one first finds
out whether it did, on a connection that answers (behind Galera with `DATABASE_WSREP_SYNC_WAIT` a causal
read): the recorder (`audit.write.chain_writer`), the ledger's read, the run's claim
(`diagnosis.services.claim_run`). Details: docs/reliability.md, *A Galera cluster behind HAProxy*.
"""

from __future__ import annotations

from django.db import connection

RETRY_AFTER_CODES = frozenset({1213, 2006, 2013, 2055})
CERTIFICATION_CONFLICT = 1213
# Pauses (seconds) before each further look-up or write after a lost connection: a proxy may still send
# the first new connection to the node that just died, until it marks it down. At most about 1.5 s of
# one pool thread, during a failover only.
LOOK_UP_PAUSES = (0.1, 0.4, 1.0)


def lost_or_conflicted(exc: BaseException) -> bool:
    """Whether `exc` is a MariaDB/MySQL error of `RETRY_AFTER_CODES` (never on SQLite: its codes are text)."""
    code = exc.args[0] if exc.args else None
    return type(code) is int and code in RETRY_AFTER_CODES


def reconnect_if_lost() -> None:
    """Close this thread's connection if it no longer answers a ping (outside an atomic block), so the
    next query opens a new one: after a lost connection, whatever error flags Django kept."""
    if not connection.in_atomic_block and connection.connection is not None and not connection.is_usable():
        connection.close()
