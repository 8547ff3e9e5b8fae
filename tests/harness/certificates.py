"""Throwaway TLS certificates for tests, made with the `openssl` command.

    certs = make_certificates(tmp_path)
    broker args: --certfile certs.server --keyfile certs.server_key [--cafile certs.ca]
    client:      certs.client_context()   (trusts certs.ca)

A CA, a server certificate for 127.0.0.1 (and localhost) and a client
certificate it signed, and a second CA that signed nothing the broker knows.
They are valid for two days and use P-256 keys (quick to make).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
    )  # fmt: skip
    return cert, key


def _signed(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> Path:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    ext = directory / f"{name}.ext"
    ext.write_text(extensions + "\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert


def encrypt_key(key: Path, out: Path, passphrase: str) -> None:
    """Write `key` encrypted with `passphrase` (AES-256) to `out`."""
    _openssl("pkey", "-in", key, "-aes256", "-passout", f"pass:{passphrase}", "-out", out)


@dataclass(frozen=True, slots=True)
class Certificates:
    directory: Path
    ca: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path
    other_ca: Path

    def client_context(self, *, trust: Path | None = None, own: bool = False) -> ssl.SSLContext:
        """A client context trusting `trust` (default: our CA), with the client
        certificate if `own`."""
        context = ssl.create_default_context(cafile=trust or self.ca)
        if own:
            context.load_cert_chain(self.client, self.client_key)
        return context

    def listener_args(self, port: int, *, cafile: bool = False) -> tuple[str, ...]:
        """`riverbed serve` options for a TLS listener on 127.0.0.1:`port`
        (asking for client certificates signed by our CA if `cafile`)."""
        args = ("--tls", f"127.0.0.1:{port}", "--certfile", str(self.server))
        args += ("--keyfile", str(self.server_key))
        return args + (("--cafile", str(self.ca)) if cafile else ())


def make_certificates(directory: Path) -> Certificates:
    """Make the CAs and certificates in `directory` (which must exist)."""
    ca = _ca(directory, "ca")
    other_ca, _ = _ca(directory, "other-ca")
    server = _signed(directory, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost")
    client = _signed(directory, "client", ca, "extendedKeyUsage=clientAuth")
    return Certificates(
        directory, ca[0], server, directory / "server.key", client, directory / "client.key",
        other_ca,
    )  # fmt: skip
