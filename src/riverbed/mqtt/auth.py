"""Who may connect and what they may do: `load_auth` joins the two, the
password file and its `Authenticator` (`passwords.py`) and the ACL and its
`Authorizer` (`acl.py`). Reading the files happens once, when the broker starts.
"""

from __future__ import annotations

from dataclasses import replace

from riverbed.mqtt.acl import Authorizer
from riverbed.mqtt.config import ACL_WILDCARD_STRICT, AuthConfig
from riverbed.mqtt.passwords import Authenticator, load_password_file


def load_auth(config: AuthConfig) -> tuple[Authenticator, Authorizer]:
    """The authenticator and authorizer a broker configuration asks for."""
    users = None if config.password_file is None else load_password_file(config.password_file)
    authorizer = Authorizer() if config.acl_file is None else Authorizer.load(config.acl_file)
    authorizer = replace(authorizer, strict=config.acl_wildcard == ACL_WILDCARD_STRICT)
    return Authenticator(users, allow_anonymous=config.allow_anonymous), authorizer
