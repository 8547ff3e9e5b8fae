"""Whether another process has a SQLite database open, and a wait for one to open it.

A SQLite storage hears of other processes' commits by polling (`PRAGMA
data_version`, sqlite.py): every few milliseconds while somebody waits, which
costs a broker with subscribers online a thread's wake-up 50 times a second
even when it is alone on its file. But another process can commit only once
it has the database open, and in WAL mode every process that has it open
holds a shared lock on its `-shm` file (SQLite's "dead man switch" byte) for
as long as it does. So:

- `others_have_open(path)` reads the kernel's table of file locks
  (`/proc/locks`) for locks on that file held by another process. It cannot
  be asked through `fcntl(F_GETLK)` on a descriptor of our own: closing any
  descriptor of a file drops every POSIX lock this process holds on it,
  SQLite's included.
- `opened_here`/`shared_here` count this process's own storages of the file:
  each wakes its own readers after its commits, not another's, which must
  poll for them as for another process's.
- `OpenWatch` waits, without polling, until a process opens one of the
  database's files (Linux inotify, `IN_OPEN` on their directory); a watcher
  that finds itself alone waits on that instead of polling.

Both answer "cannot tell" where they cannot (no `/proc/locks`, no inotify, a
file that does not exist): `others_have_open` says True then, and `OpenWatch.start`
returns None, so the caller polls as it always did.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
import threading
from pathlib import Path

LOCKS = Path("/proc/locks")

_here: dict[str, int] = {}
"""Per database file (its real path): how many storages of this process have it open."""
_here_lock = threading.Lock()

_IN_OPEN = 0x00000020
_IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")
"""inotify_event: wd, mask, cookie, len; then `len` bytes of name, NUL-padded."""


def database_files(path: Path) -> frozenset[str]:
    """The names of the files SQLite keeps for the database at `path` (in its
    directory): the database, its WAL, its shared-memory index, its rollback
    journal."""
    name = path.name
    return frozenset((name, f"{name}-wal", f"{name}-shm", f"{name}-journal"))


def others_have_open(path: Path, *, locks: Path = LOCKS) -> bool:
    """Whether a process other than this one holds a lock on the database at
    `path`'s `-shm` file: in WAL mode, whether another process has the database
    open. True when it cannot tell (no such file, no lock table to read)."""
    try:
        shm = os.stat(f"{path}-shm")
        table = locks.read_text()
    except OSError:
        return True
    # /proc/locks names a file as "MAJOR:MINOR:INODE", the device numbers in hex
    # ("%02x:%02x:%lu"); a line is "1: POSIX  ADVISORY  READ  PID DEV:INODE START END",
    # with "->" after the number for a lock that waits.
    ident = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"
    me = str(os.getpid())
    for line in table.splitlines():
        fields = line.split()
        try:
            at = fields.index(ident)
        except ValueError:
            continue
        if fields[at - 1] != me:  # an OFD lock's pid reads -1: not ours either
            return True
    return False


def opened_here(path: Path) -> str:
    """Count a storage of this process that opens the database at `path`; the
    key to give `closed_here` when it closes."""
    key = os.path.realpath(path)
    with _here_lock:
        _here[key] = _here.get(key, 0) + 1
    return key


def closed_here(key: str) -> None:
    with _here_lock:
        left = _here.get(key, 0) - 1
        if left > 0:
            _here[key] = left
        else:
            _here.pop(key, None)


def shared_here(key: str) -> bool:
    """Whether more than one storage of this process has that file open: each
    tells its own readers of its own commits only, so the others must look."""
    with _here_lock:
        return _here.get(key, 0) > 1


class OpenWatch:
    """Tells when a process opens one of a SQLite database's files.

    `wait(timeout)` blocks until one is opened (True) or `timeout` passes
    (False); opens that happened since the last wait count. This process's own
    opens count too (a new connection of another thread): a caller checks who
    has the file open before it trusts the quiet. `interrupt` ends a wait from
    another thread (and every later one) at once; `close` frees the watch.
    """

    def __init__(self, inotify: int, files: frozenset[str]) -> None:
        self._inotify = inotify
        self._files = files
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll = select.poll()  # not select(): descriptors above 1023 (a busy broker's)
        self._poll.register(inotify, select.POLLIN)
        self._poll.register(self._wake_r, select.POLLIN)
        self._lock = threading.Lock()
        self._closed = False
        self.opens = 0
        """Opens of the database's files seen so far."""

    @classmethod
    def start(cls, path: Path) -> OpenWatch | None:
        """A watch of the directory of the database at `path`; None where inotify
        is not to be had (not Linux, or no instance or watch left for this user:
        `fs.inotify.max_user_instances`, `max_user_watches`)."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(path.parent), _IN_OPEN) < 0:
            os.close(fd)
            return None
        return cls(fd, database_files(path))

    def wait(self, timeout: float) -> bool:
        """Block until a file of the database is opened or `timeout` passes."""
        with self._lock:
            if self._closed:
                return False
        ready = [fd for fd, _ in self._poll.poll(max(0, round(timeout * 1000)))]
        with self._lock:
            if self._closed or self._wake_r in ready:
                return False
            return self._drain()

    def interrupt(self) -> None:
        """End the current wait and every later one (`stop`ping a watcher)."""
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # a byte waits already
                os.write(self._wake_w, b"\0")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._inotify, self._wake_r, self._wake_w):
                os.close(fd)

    def _drain(self) -> bool:
        """Read the events waiting (with the lock held); True if one was an open
        of the database's files, or if events were lost (the queue overflowed)."""
        opened = False
        while True:
            try:
                data = os.read(self._inotify, 65536)
            except BlockingIOError:
                return opened
            at = 0
            while at + _EVENT.size <= len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                if mask & _IN_Q_OVERFLOW or os.fsdecode(name) in self._files:
                    self.opens += 1
                    opened = True


_LIBC: ctypes.CDLL | bool | None = False
"""The C library with inotify, once looked for (False: not yet)."""


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is False:
        found: ctypes.CDLL | None = None
        name = ctypes.util.find_library("c")
        if name is not None:
            try:
                libc = ctypes.CDLL(name, use_errno=True)
                libc.inotify_init1.argtypes = [ctypes.c_int]
                libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
                found = libc
            except (OSError, AttributeError):
                found = None
        _LIBC = found
    return _LIBC if isinstance(_LIBC, ctypes.CDLL) else None
