"""`riverbed ...`: the command line over topics, producing and named subscriptions.

Output is for people (rich tables) unless `--json` asks for machine-readable
JSON; `produce` and `consume` speak JSON lines. Every `RiverbedError` ends the
command with `error: <message>` on stderr and no traceback: exit code 2 for a bad
value (`InvalidInput`, like click's own usage errors), 1 for everything else
(not found, exists already, storage unreachable). Ctrl-C ends it with
`interrupted` and exit code 130. Any other exception is a bug and keeps its
traceback.

The database is `--db URL` on the command, else `--db URL` on `riverbed`, else
`$RIVERBED_DB`, else the embedded default (`riverbed.storage.default_url`).
Commands that only read or change what exists refuse a database that does not
exist (`open_log()`); the few that create things create it (`open_log(create=True)`)
and say so on stderr.
"""

from __future__ import annotations

# A command's module is imported when the command is asked for (`COMMAND_MODULES`).
from riverbed.cli._app import COMMAND_MODULES, PRODUCE_BATCH, cli, main

__all__ = ["COMMAND_MODULES", "PRODUCE_BATCH", "cli", "main"]
