"""Database URLs in messages: the password never shows.

Every message that names a database prints `redact_url(url)`. Text that comes
from a driver goes through `redact_password` too: libpq quotes pieces of a
malformed URL back (`invalid percent-encoded token: "<password>"`).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_MASK = "***"

_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
"""libpq also takes the password as a query parameter: `...?password=secret`."""


def redact_url(url: str) -> str:
    """`url` with its password shown as `***`: `postgresql://user:***@host/db`.

    Works on malformed URLs too (they end up in error messages): the user info is
    whatever precedes the last `@` before the query, so a password holding an
    unencoded `/` or `@` is still hidden.
    """
    scheme, separator, rest = url.partition("://")
    if separator:
        authority_and_path, question, query = rest.partition("?")
        userinfo, at, host_and_path = authority_and_path.rpartition("@")
        if at and ":" in userinfo:
            user = userinfo.partition(":")[0]
            rest = f"{user}:{_MASK}@{host_and_path}{question}{query}"
    return _QUERY_PASSWORD.sub(rf"\g<1>{_MASK}", scheme + separator + rest)


def redact_password(text: str, url: str) -> str:
    """`text` (a driver's message about `url`) with the URL's password, as written
    and percent-decoded, replaced by `***`."""
    for secret in _passwords(url):
        text = text.replace(secret, _MASK)
    return text


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    _, separator, rest = url.partition("://")
    if separator:
        userinfo, at, _ = rest.partition("?")[0].rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.partition(":")[2])
    found += [m.group(0).partition("=")[2] for m in _QUERY_PASSWORD.finditer(url)]
    secrets = {s for p in found for s in (p, unquote(p)) if s}
    return sorted(secrets, key=len, reverse=True)  # longest first: no partial masking
