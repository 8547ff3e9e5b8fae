"""The TLS listener's server context (and the WSS one's), built (and so validated) once at start.

    context = server_context(config.listeners.tls)
    await asyncio.start_server(accept, host, port, ssl=context)

TLS 1.2 or later. With `cafile`, a client must present a certificate that a CA
in it signed (mutual TLS); without, clients are not asked for one.

OpenSSL reports most failures as "PEM lib", without saying which file or what is
wrong. `server_context` checks the pieces one at a time so that `riverbed
serve` can refuse to start with an `InvalidConfig` naming the key, the file and
the problem: no certificate in the certificate file, no usable private key in
the key file, an encrypted key (the broker cannot ask for a passphrase), a key
that is not the certificate's, no CA certificate in the CA file.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from riverbed.errors import InvalidConfig
from riverbed.mqtt.config import TlsListener, WebSocketListener


class _Encrypted(Exception):
    """Raised by the passphrase callback: OpenSSL asks only for an encrypted key."""


def _no_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal and hang a service.
    raise _Encrypted


def server_context(listener: TlsListener | WebSocketListener) -> ssl.SSLContext:
    """A server `SSLContext` for `listener` (the TLS listener, or the WebSocket
    one serving WSS), or `InvalidConfig` naming what is wrong."""
    section = "listeners.ws" if isinstance(listener, WebSocketListener) else "listeners.tls"
    certfile, keyfile = listener.certfile, listener.keyfile
    if certfile is None or keyfile is None:
        raise InvalidConfig(f"{section}: no certfile and keyfile, so no TLS to serve")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _check_certificates(f"{section}.certfile", certfile, "no PEM certificate")
    cert = f"{section}.certfile = {str(certfile)!r}"
    key = f"{section}.keyfile = {str(keyfile)!r}"
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_passphrase)
    except _Encrypted:
        raise InvalidConfig(
            f"{key}: the private key is encrypted and the broker cannot ask for its"
            " passphrase; give it an unencrypted key (openssl pkey -in KEY -out PLAIN)"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise InvalidConfig(
                f"{key} is not the private key of the certificate in {cert}"
            ) from None
        # The certificate file was read above, so the key is what failed.
        raise InvalidConfig(
            f"{key}: no PEM private key could be read from it (OpenSSL: {exc.reason or exc})"
        ) from None
    except OSError as exc:  # the files changed since the configuration was checked
        raise InvalidConfig(f"{cert}, {key}: cannot be read ({exc.strerror})") from None
    if listener.cafile is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        _check_certificates(f"{section}.cafile", listener.cafile, "no PEM CA certificate")
        context.load_verify_locations(cafile=listener.cafile)
    return context


def _check_certificates(key: str, path: Path, missing: str) -> None:
    """Refuse a file from which OpenSSL reads no certificate."""
    scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        scratch.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise InvalidConfig(
            f"{key} = {str(path)!r}: {missing} could be read from it (OpenSSL: {exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise InvalidConfig(f"{key} = {str(path)!r}: cannot be read ({exc.strerror})") from None
