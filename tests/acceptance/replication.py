"""A primary and a streaming standby: two private PostgreSQL clusters on 127.0.0.1, for the
failover tests.

The primary is a :class:`tests.servers.PrivatePostgres`; the standby is a copy of it taken
with ``pg_basebackup -R`` (so it streams from the primary from its first start) on a port
of its own. ``synchronous=True`` makes every commit on the primary wait until the standby
has flushed its WAL (``synchronous_standby_names``), so nothing the primary acknowledged
can be missing after a promotion.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.servers import PrivatePostgres, free_port, wait_until


@dataclass
class Standby(PrivatePostgres):
    """A hot standby of ``primary`` (same system user, same superuser ``postgres``)."""

    primary: PrivatePostgres | None = None
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        import pwd

        from pgserver import _commands
        from pgserver.utils import ensure_prefix_permissions

        assert self.primary is not None
        self.user = self.primary.user
        self.root = Path(tempfile.mkdtemp(prefix="pgstage-standby-"))
        self.data = self.root / "pg"
        if self.user is not None:  # running as root: the server's user owns the copy
            entry = pwd.getpwnam(self.user)
            self.root.chmod(0o755)
            shutil.chown(self.root, entry.pw_uid, entry.pw_gid)
            ensure_prefix_permissions(self.root)
        _commands.pg_basebackup(
            [
                f"--dbname=host=127.0.0.1 port={self.primary.port} user=postgres "
                "application_name=standby",
                f"--pgdata={self.data}",
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
            ],
            user=self.user,
            timeout=120,
        )
        (self.data / "server.log").unlink(missing_ok=True)  # the primary's, copied along
        self.start()

    def promote(self) -> None:
        """``pg_ctl promote``, waiting until the server accepts writes."""
        self._pg_ctl("-w", "promote")


@dataclass
class ReplicatedPair:
    """A primary and its standby, and the multi-host URL a client fails over with."""

    synchronous: bool
    primary: PrivatePostgres = field(init=False)
    standby: Standby = field(init=False)

    def __post_init__(self) -> None:
        self.primary = PrivatePostgres()
        try:
            with psycopg.connect(self.primary.url(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE pgstage")
                # Streaming only: no archive; the standby keeps up through the WAL kept
                # for its slot-less connection (plenty for a short test).
                conn.execute("ALTER SYSTEM SET wal_keep_size = '256MB'")
                conn.execute("SELECT pg_reload_conf()")
            self.standby = Standby(primary=self.primary)
            if self.synchronous:
                # Set after the copy, on the primary only: a promoted standby that
                # inherited it would wait for ever for a standby of its own.
                with psycopg.connect(self.primary.url(), autocommit=True) as conn:
                    conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                    conn.execute("SELECT pg_reload_conf()")
            wait_until(
                self.streaming,
                timeout=30,
                message="the standby to stream from the primary",
            )
        except BaseException:
            self.primary.remove()
            raise

    def url(self, dbname: str = "pgstage") -> str:
        """Both servers; libpq takes the first that accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{dbname}?target_session_attrs=read-write"
        )

    def streaming(self) -> bool:
        """The primary sees its standby streaming (and, when synchronous, as ``sync``)."""
        with psycopg.connect(self.primary.url(), autocommit=True, connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT state, sync_state FROM pg_stat_replication "
                "WHERE application_name = 'standby'"
            ).fetchone()
        wanted = "sync" if self.synchronous else "async"
        return row == ("streaming", wanted)

    def fail_over(self) -> None:
        """Crash the primary (``immediate``: no shutdown checkpoint, nothing more sent to the
        standby) and promote the standby."""
        self.primary.stop(mode="immediate")
        self.standby.promote()

    def remove(self) -> None:
        self.standby.remove()
        self.primary.remove()
