"""Files of hashed secrets, one line per named entry: the MQTT password file
(`riverbed passwd`, `riverbed.mqtt.passwords`) and the admin HTTP API's token file
(`riverbed token`, `riverbed.http.auth`).

Such a file is read whole (`read_text`), changed in memory and written back
whole (`write_atomically`): a temporary file beside it, mode 0600, renamed over
it, so a reader sees the old file or the new one, never part of either, also
after a crash. `remove_entry` is the one edit both kinds make the same way.
The format of the lines is each kind's own.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TypeVar

from riverbed.errors import InvalidConfig, NotFound

T = TypeVar("T")


def read_text(path: str | Path, kind: str) -> str:
    """The text of the `kind` file (e.g. "password") at `path`.

    Raises `NotFound` when there is no such file, and `InvalidConfig` when it
    cannot be read or is not UTF-8; each message names the file."""
    shown = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{kind} file {shown!r} does not exist") from None
    except OSError as exc:
        raise InvalidConfig(f"{kind} file {shown!r} cannot be read: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidConfig(f"{kind} file {shown!r} is not UTF-8 at byte {exc.start}") from None


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace the file at `path` (through a symlink: the file it points at) with
    `data`, mode 0600, keeping its owner when it has one. `InvalidConfig` when
    the directory cannot take the new file; nothing has changed then."""
    target = Path(os.path.realpath(path))
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
        )
    except OSError as exc:
        raise InvalidConfig(f"cannot write {str(path)!r}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
        with suppress(OSError):  # keep the owner when root edits another user's file
            status = os.stat(target)
            os.fchown(fd, status.st_uid, status.st_gid)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise
    with suppress(OSError):  # make the rename itself durable
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def remove_entry(
    path: str | Path,
    name: str,
    load: Callable[[str | Path], dict[str, T]],
    save: Callable[[str | Path, dict[str, T]], None],
    *,
    entry: str,
    kind: str,
) -> None:
    """Remove entry `name` from the file at `path`, read with `load` and written
    with `save`. `NotFound` names the entry (an `entry`, e.g. "user") and the
    `kind` file when it is not there; the file is unchanged then."""
    entries = load(path)
    if name not in entries:
        raise NotFound(f"{entry} {name!r} is not in {kind} file {str(path)!r}")
    del entries[name]
    save(path, entries)
