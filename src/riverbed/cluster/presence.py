"""Which broker nodes on one SQLite file still run: a lock each, which the
kernel drops when its process ends.

Nodes sharing an SQLite file have no bus to tell each other apart (that is
PostgreSQL's, `cluster/bus.py`): a node's liveness lease was all the others
knew of it, so a node killed with SIGKILL held its sessions and its clients'
Wills for as long as its lease ran (30 s by default), even from its own
successor, which takes a new name at each start. Every node on the file
therefore holds an exclusive `flock` on a file of its own in the folder
`<database>.nodes/` from its start to its stop. A process that ends, however
it ends, loses its locks, so a file whose lock can be taken is a node that is
gone (`FilePresence.reap`): its lease can end now (`ClusterNode`, mqtt/node.py).

A node without a file (an older version, or a database reached by another
path) cannot be told gone this way: its lease still decides.

    presence = FilePresence(Path("/data/riverbed.db"))
    presence.hold("node-1")        # at the start, before the lease
    gone = presence.reap()         # names of the nodes whose process ended
    presence.leave()               # at the stop
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from urllib.parse import quote, unquote

from riverbed.errors import NodeRunning

SUFFIX = ".lock"
HOLD_WAIT = 5.0
"""Seconds `hold` waits for the lock of its file, which another node's `reap`
may hold for a moment (a node restarted under a fixed name)."""


class FilePresence:
    """The presence files of the nodes of one SQLite database (see the module)."""

    def __init__(self, database: Path) -> None:
        database = database.resolve()
        self.folder = database.with_name(database.name + ".nodes")
        self._fd: int | None = None
        self._path: Path | None = None

    def path_of(self, node: str) -> Path:
        """The presence file of node `node`."""
        return self.folder / (quote(node, safe="") + SUFFIX)

    def hold(self, node: str) -> None:
        """Hold `node`'s presence until `leave` or the end of this process.
        `NodeRunning` if a running process holds it already."""
        self.folder.mkdir(exist_ok=True)
        path = self.path_of(node)
        deadline = time.monotonic() + HOLD_WAIT
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise NodeRunning(
                        f"node {node!r} runs already: another process holds {path}"
                    ) from None
                time.sleep(0.05)
                continue
            if _same_file(fd, path):
                self._fd, self._path = fd, path
                return
            # A `reap` took the file away between our open and our lock: the
            # lock is on a file nobody else sees. Again, on a new one.
            os.close(fd)

    def leave(self) -> None:
        """Give up the presence `hold` took (its file goes)."""
        fd, path = self._fd, self._path
        self._fd = self._path = None
        if fd is None or path is None:
            return
        if _same_file(fd, path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.close(fd)

    def reap(self) -> set[str]:
        """The nodes whose process ended without `leave`: their files' locks
        could be taken. Their files go (each once: another `reap` at the same
        time names the ones it took)."""
        gone: set[str] = set()
        try:
            names = [p for p in self.folder.iterdir() if p.name.endswith(SUFFIX)]
        except FileNotFoundError:
            return gone
        for path in names:
            if path == self._path:
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its node runs
                if not _same_file(fd, path):
                    continue  # reaped meanwhile, and maybe held anew
                path.unlink()
                gone.add(unquote(path.name.removesuffix(SUFFIX)))
            finally:
                os.close(fd)
        return gone


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)
