"""Broker configuration: the TOML file and overrides give a typed, frozen config;
every bad value is refused with a message naming where it came from, the key,
the value and the rule."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

from riverbed.errors import InvalidConfig, InvalidInput
from riverbed.mqtt import config as config_module
from riverbed.mqtt.config import (
    KEYS,
    Address,
    AuthConfig,
    BrokerConfig,
    Limits,
    Listeners,
    StorageConfig,
    TlsListener,
    WebSocketListener,
    load_config,
)
from riverbed.sharedsub.config import SharedSubConfig

ANONYMOUS = {"auth.allow_anonymous": True}


def load(overrides: dict[str, Any] | None = None, path: Path | None = None) -> BrokerConfig:
    return load_config(path, {**ANONYMOUS, **(overrides or {})})


def toml(tmp_path: Path, text: str, name: str = "riverbed.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def touch(path: Path) -> Path:
    path.write_text("x")
    return path


# --------------------------------------------------------------------- defaults


def test_defaults() -> None:
    config = load()
    assert config.listeners == Listeners(Address("127.0.0.1", 1883), None)
    assert config.storage == StorageConfig(None)
    assert config.limits == Limits(
        receive_maximum=100,
        topic_alias_maximum=16,
        maximum_packet_size=1048576,
        server_keep_alive=None,
        max_session_expiry=7 * 24 * 3600,
        default_session_expiry=None,
        session_queue_limit=1000,
        max_inflight=100,
        retain_available=True,
        write_buffer_limit=1048576,
        slow_consumer_timeout=60,
        connect_timeout=10,
    )
    assert config.limits.v311_session_expiry == 7 * 24 * 3600
    assert config.auth == AuthConfig(allow_anonymous=True)


def test_no_way_to_connect_is_refused() -> None:
    message = "auth.allow_anonymous is false and no auth.password_file is set"
    with pytest.raises(InvalidConfig, match=message):
        load_config()
    with pytest.raises(InvalidConfig, match=message):
        BrokerConfig()


def test_the_documented_example_file_loads(tmp_path: Path) -> None:
    """The module docstring's complete file, with its files present."""
    doc = config_module.__doc__ or ""
    example = doc.split("A complete file, with the defaults:\n")[1].split("\nRelative file")[0]
    text = "\n".join(line.removeprefix("    ") for line in example.splitlines())
    for name in ("server.pem", "server.key", "clients-ca.pem", "passwd", "acl"):
        touch(tmp_path / name)
    text = text.replace("# password_file", "password_file").replace("# acl_file", "acl_file")
    config = load_config(toml(tmp_path, text))
    assert config.listeners.tls == TlsListener(
        Address("0.0.0.0", 8883),
        tmp_path / "server.pem",
        tmp_path / "server.key",
        tmp_path / "clients-ca.pem",
    )
    assert dataclasses.replace(config.limits) == Limits()
    assert config.auth == AuthConfig(False, tmp_path / "passwd", tmp_path / "acl")
    assert config.storage.url == "sqlite:///./riverbed-data/riverbed.db"
    assert config.storage.commit_interval_ms == 3
    assert config.storage.poll_interval_ms == 20
    assert config.storage.idle_cursor_interval == 1


def test_every_key_is_a_field_and_every_field_a_key() -> None:
    def keys(prefix: str, cls: Any) -> set[str]:
        out: set[str] = set()
        for f in dataclasses.fields(cls):
            if f.name == "tls":
                out |= keys(f"{prefix}tls.", TlsListener)
            elif f.name == "ws":
                out |= keys(f"{prefix}ws.", WebSocketListener)
            elif f.name == "timers":  # [shared_subscriptions] holds them flat
                out |= keys(prefix, SharedSubConfig)
            elif dataclasses.is_dataclass(f.default_factory):
                out |= keys(f"{prefix}{f.name}.", f.default_factory)
            else:
                out.add(f"{prefix}{f.name}")
        return out

    assert keys("", BrokerConfig) == set(KEYS)


def test_shared_subscription_timers_come_from_their_section(tmp_path: Path) -> None:
    text = """
[auth]
allow_anonymous = true
[shared_subscriptions]
ping_interval = 1.5
ping_timeout = "2"
leader_borrower_timeout = 3
"""
    config = load_config(toml(tmp_path, text))
    shared = config.shared_subscriptions
    assert shared.enabled
    assert shared.timers == SharedSubConfig(
        ping_interval=1.5, ping_timeout=2.0, leader_borrower_timeout=3.0
    )
    assert not load_config(
        None, {"auth.allow_anonymous": True, "shared_subscriptions.enabled": "false"}
    ).shared_subscriptions.enabled


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"shared_subscriptions.ping_timeout": "0"}, "positive number of seconds"),
        ({"shared_subscriptions.ping_timeout": "soon"}, "positive number of seconds"),
        ({"shared_subscriptions.ping_interval": "5"}, "leader_borrower_timeout"),
        ({"shared_subscriptions.leader_claim_lease": "5"}, "must exceed leader_borrower_timeout"),
    ],
)
def test_bad_shared_subscription_timers_are_refused(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidConfig, match=message) as caught:
        load_config(None, {"auth.allow_anonymous": True, **overrides})
    key = next(iter(overrides)).rpartition(".")[2]
    assert key in str(caught.value)


# --------------------------------------------------------------------- file and overrides


def test_overrides_beat_the_file_and_none_means_not_given(tmp_path: Path) -> None:
    path = toml(tmp_path, "[limits]\nreceive_maximum = 10\nmax_inflight = 20\n")
    config = load({"limits.receive_maximum": "30", "limits.max_inflight": None}, path)
    assert (config.limits.receive_maximum, config.limits.max_inflight) == (30, 20)


def test_relative_paths_in_the_file_are_relative_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "etc").mkdir()
    touch(tmp_path / "etc" / "passwd")
    touch(tmp_path / "here")
    path = toml(tmp_path / "etc", '[auth]\npassword_file = "passwd"\nacl_file = "../here"\n')
    monkeypatch.chdir(tmp_path)
    config = load_config(path)
    assert config.auth.password_file == tmp_path / "etc" / "passwd"
    assert config.auth.acl_file == tmp_path / "etc" / ".." / "here"
    absolute = toml(tmp_path, f'[auth]\npassword_file = "{tmp_path / "here"}"\n', "abs.toml")
    assert load_config(absolute).auth.password_file == tmp_path / "here"
    # Overrides are relative to the working directory.
    override = load_config(path, {"auth.password_file": "here"})
    assert override.auth.password_file == Path("here")


def test_typed_overrides_and_strings_from_flags() -> None:
    config = load(
        {
            "listeners.mqtt": Address("::1", 0),
            "limits.retain_available": "off",
            "limits.server_keep_alive": "1m",
            "limits.max_session_expiry": "never",
            "limits.default_session_expiry": 3600,
            "storage.url": "postgresql://riverbed@db/riverbed",
        }
    )
    assert str(config.listeners.mqtt) == "[::1]:0"
    assert config.limits.retain_available is False
    assert config.limits.server_keep_alive == 60
    assert config.limits.max_session_expiry == 0xFFFFFFFF
    assert config.limits.v311_session_expiry == 3600
    assert config.storage.url == "postgresql://riverbed@db/riverbed"


# --------------------------------------------------------------------- value rules

RULES: list[tuple[str, object, str]] = [
    ("limits.receive_maximum", 0, "from 1 to 65535"),
    ("limits.receive_maximum", 65536, "from 1 to 65535"),
    ("limits.receive_maximum", "ten", "from 1 to 65535"),
    ("limits.receive_maximum", True, "from 1 to 65535"),
    ("limits.receive_maximum", 1.5, "from 1 to 65535"),
    ("limits.receive_maximum", " 7", "from 1 to 65535"),
    ("limits.receive_maximum", "²", "from 1 to 65535"),
    ("limits.topic_alias_maximum", -1, "from 0 to 65535"),
    ("limits.topic_alias_maximum", 65536, "from 0 to 65535"),
    ("limits.maximum_packet_size", 127, "from 128 to 268435460 bytes"),
    ("limits.maximum_packet_size", 268435461, "from 128 to 268435460 bytes"),
    ("limits.server_keep_alive", 65536, "whole seconds from 0 to 65535"),
    ("limits.server_keep_alive", "1500ms", "whole seconds"),
    ("limits.server_keep_alive", "never", "whole seconds from 0 to 65535,"),
    ("limits.max_session_expiry", 2**32, "whole seconds from 0 to 4294967295"),
    ("limits.max_session_expiry", "-1s", "whole seconds"),
    ("limits.max_session_expiry", -1, "whole seconds from 0 to 4294967295"),
    ("limits.server_keep_alive", -5, "whole seconds from 0 to 65535"),
    ("limits.stop_grace", 0, "whole seconds from 1 to 3600"),
    ("limits.stop_grace", 3601, "whole seconds from 1 to 3600"),
    ("limits.max_session_expiry", "soon", 'or "never"'),
    ("limits.default_session_expiry", "0.5s", "whole seconds"),
    ("limits.session_queue_limit", 0, "of at least 1"),
    ("limits.max_inflight", 0, "from 1 to 65535"),
    ("limits.max_inflight", 65536, "from 1 to 65535"),
    ("limits.retain_available", "maybe", "must be true or false"),
    ("limits.retain_available", 1, "must be true or false"),
    ("limits.write_buffer_limit", 4095, "must be an integer from 4096 to 1073741824 bytes"),
    ("limits.write_buffer_limit", 2**30 + 1, "from 4096 to 1073741824 bytes"),
    ("limits.write_buffer_limit", "1MB", "from 4096 to 1073741824 bytes"),
    ("limits.slow_consumer_timeout", 0, "must be whole seconds from 1 to 86400"),
    ("limits.slow_consumer_timeout", "2d", "whole seconds from 1 to 86400"),
    ("limits.slow_consumer_timeout", "0.5s", "whole seconds from 1 to 86400"),
    ("limits.slow_consumer_timeout", "never", "whole seconds from 1 to 86400"),
    ("limits.connect_timeout", 0, "must be whole seconds from 1 to 3600"),
    ("limits.connect_timeout", "2h", "whole seconds from 1 to 3600"),
    ("limits.connect_timeout", 2.5, "whole seconds from 1 to 3600"),
    ("auth.allow_anonymous", "sometimes", "must be true or false"),
    ("listeners.mqtt", 1883, "must be HOST:PORT as a string"),
    ("storage.url", 5, "must be a database URL string"),
    ("storage.url", "mysql://localhost/db", "unsupported scheme 'mysql'; use sqlite:///PATH"),
    ("storage.url", "relative.db", "unsupported scheme ''; use sqlite:///PATH"),
    ("storage.url", "sqlite:///x.db?synchronous=off", "synchronous='off' must be normal or full"),
    ("storage.commit_interval_ms", -1, "must be an integer from 0 to 1000 ms"),
    ("storage.commit_interval_ms", 1001, "must be an integer from 0 to 1000 ms"),
    ("storage.commit_interval_ms", 0.5, "must be an integer from 0 to 1000 ms"),
    ("storage.poll_interval_ms", 0, "must be an integer from 1 to 60000 ms"),
    ("storage.poll_interval_ms", 60_001, "must be an integer from 1 to 60000 ms"),
    ("storage.poll_interval_ms", "fast", "must be an integer from 1 to 60000 ms"),
    ("storage.idle_cursor_interval", 0, "whole seconds from 1 to 3600"),
    ("storage.idle_cursor_interval", "2h", "whole seconds from 1 to 3600"),
    ("storage.idle_cursor_interval", "0.5s", "whole seconds from 1 to 3600"),
    ("auth.password_file", "", "must be the name of a file"),
    ("auth.password_file", 7, "must be the name of a file"),
]


@pytest.mark.parametrize(("key", "value", "rule"), RULES)
def test_bad_override_names_the_key_the_value_and_the_rule(
    key: str, value: object, rule: str
) -> None:
    with pytest.raises(InvalidConfig, match=re.escape(rule)) as caught:
        load({key: value})
    assert str(caught.value).startswith(f"command line: {key} = {value!r}: ")
    assert isinstance(caught.value, InvalidInput) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize(("key", "value", "rule"), RULES)
def test_bad_value_in_the_file_names_the_file(
    tmp_path: Path, key: str, value: object, rule: str
) -> None:
    section, _, name = key.rpartition(".")
    literal = str(value).lower() if isinstance(value, bool) else repr(value).replace("'", '"')
    path = toml(tmp_path, f"[{section}]\n{name} = {literal}\n")
    with pytest.raises(InvalidConfig, match=re.escape(rule)) as caught:
        load_config(path, ANONYMOUS)
    assert str(caught.value).startswith(f"{path}: {key} = ")


def test_a_bad_url_never_shows_its_password() -> None:
    with pytest.raises(InvalidConfig) as caught:
        load({"storage.url": "mysql://user:hunter2@db/x"})
    assert "hunter2" not in str(caught.value)
    assert "mysql://user:***@db/x" in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("limits.receive_maximum", 1, 1),
        ("limits.receive_maximum", 65535, 65535),
        ("limits.topic_alias_maximum", 0, 0),
        ("limits.maximum_packet_size", 128, 128),
        ("limits.maximum_packet_size", 268435460, 268435460),
        ("limits.server_keep_alive", 0, 0),
        ("limits.server_keep_alive", "18h12m15s", 65535),
        ("limits.max_session_expiry", 0, 0),
        ("limits.max_session_expiry", "NEVER", 4294967295),
        ("limits.max_session_expiry", "4294967295", 4294967295),
        ("limits.session_queue_limit", 10**7, 10**7),
        ("limits.retain_available", "Yes", True),
        ("limits.write_buffer_limit", 4096, 4096),
        ("limits.write_buffer_limit", "1073741824", 1073741824),
        ("limits.slow_consumer_timeout", 1, 1),
        ("limits.slow_consumer_timeout", "24h", 86400),
        ("limits.connect_timeout", 1, 1),
        ("limits.connect_timeout", "1h", 3600),
        ("auth.allow_anonymous", "1", True),
        (
            "storage.url",
            "sqlite:////var/lib/riverbed/riverbed.db?synchronous=full",
            "sqlite:////var/lib/riverbed/riverbed.db?synchronous=full",
        ),
        ("storage.url", "postgres://u@h:5432/d", "postgres://u@h:5432/d"),
    ],
)
def test_edge_values_are_accepted(key: str, value: object, expected: object) -> None:
    """Each edge value loads, and as what it says (18h12m15s is above 65535 s, the
    most a Server Keep Alive can say, so it is capped there)."""
    section, name = key.split(".")
    assert getattr(getattr(load({key: value}), section), name) == expected


def test_default_session_expiry_cannot_exceed_the_maximum() -> None:
    with pytest.raises(InvalidConfig, match=r"limits\.default_session_expiry = 7200 is more than"):
        load({"limits.max_session_expiry": "1h", "limits.default_session_expiry": "2h"})
    assert load({"limits.default_session_expiry": "never", "limits.max_session_expiry": "never"})


# --------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:1883", "127.0.0.1", 1883),
        ("0.0.0.0:0", "0.0.0.0", 0),
        ("[::1]:1883", "::1", 1883),
        ("[::]:65535", "::", 65535),
        ("[fe80::1%eth0]:1883", "fe80::1%eth0", 1883),
        ("localhost:1883", "localhost", 1883),
        ("mqtt.example.com.:8883", "mqtt.example.com.", 8883),
    ],
)
def test_addresses(text: str, host: str, port: int) -> None:
    address = Address.parse(text)
    assert (address.host, address.port) == (host, port)
    assert str(address) == text
    assert load({"listeners.mqtt": text}).listeners.mqtt == address


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("1883", "is not HOST:PORT"),
        (":1883", "has no host"),
        ("::1:1883", "an IPv6 address goes in brackets"),
        ("[::1]1883", r"is not \[IPV6\]:PORT"),
        ("[::1", r"is not \[IPV6\]:PORT"),
        ("[localhost]:1883", "is not an IPv6 address"),
        ("host:", "the port '' is not a number 0..65535"),
        ("host:65536", "is not a number 0..65535"),
        ("host:-1", "is not a number 0..65535"),
        ("host:１２", "is not a number 0..65535"),
        ("host:1e3", "is not a number 0..65535"),
        ("bad_host:1883", "neither an IP address nor a DNS name"),
        ("a..b:1883", "neither an IP address nor a DNS name"),
        ("-a:1883", "neither an IP address nor a DNS name"),
        ("300.1.1.1:1883", "is not an IPv4 address"),
        ("127.1:1883", "is not an IPv4 address"),
    ],
)
def test_bad_addresses(text: str, rule: str) -> None:
    with pytest.raises(InvalidConfig, match=rule):
        Address.parse(text)
    prefix = f"command line: listeners.mqtt: address {text!r}"
    with pytest.raises(InvalidConfig, match=re.escape(prefix)):
        load({"listeners.mqtt": text})


def test_addresses_check_themselves() -> None:
    with pytest.raises(InvalidConfig, match="has no host"):
        Address("", 1883)
    with pytest.raises(InvalidConfig, match=r"the port must be 0\.\.65535"):
        Address("localhost", 70000)


# --------------------------------------------------------------------- TLS and files


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    return {
        "listeners.tls.address": "0.0.0.0:8883",
        "listeners.tls.certfile": str(touch(tmp_path / "cert.pem")),
        "listeners.tls.keyfile": str(touch(tmp_path / "key.pem")),
    }


def test_tls_listener(pem: dict[str, str], tmp_path: Path) -> None:
    tls = load(pem).listeners.tls
    assert tls == TlsListener(
        Address("0.0.0.0", 8883), tmp_path / "cert.pem", tmp_path / "key.pem", None
    )
    ca = str(touch(tmp_path / "ca.pem"))
    with_ca = load({**pem, "listeners.tls.cafile": ca}).listeners.tls
    assert with_ca is not None and with_ca.cafile == Path(ca)


@pytest.mark.parametrize(
    "missing",
    [
        ["listeners.tls.address"],
        ["listeners.tls.certfile"],
        ["listeners.tls.keyfile"],
        ["listeners.tls.certfile", "listeners.tls.keyfile"],
    ],
)
def test_a_partial_tls_listener_names_what_is_missing(
    pem: dict[str, str], missing: list[str]
) -> None:
    given = {k: v for k, v in pem.items() if k not in missing}
    with pytest.raises(InvalidConfig, match=f"but {', '.join(missing)} missing"):
        load(given)


def test_a_cafile_alone_is_a_partial_tls_listener(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match=r"listeners\.tls\.cafile given but"):
        load({"listeners.tls.cafile": str(touch(tmp_path / "ca.pem"))})


def test_tls_and_mqtt_listeners_need_different_addresses(pem: dict[str, str]) -> None:
    with pytest.raises(InvalidConfig, match="the two listeners need different ports"):
        load({**pem, "listeners.mqtt": "0.0.0.0:8883"})
    load({**pem, "listeners.mqtt": "0.0.0.0:0", "listeners.tls.address": "0.0.0.0:0"})


@pytest.mark.parametrize(
    "key",
    [
        "listeners.tls.certfile",
        "listeners.tls.keyfile",
        "listeners.tls.cafile",
        "auth.password_file",
        "auth.acl_file",
    ],
)
def test_files_must_exist_and_be_regular_files(
    pem: dict[str, str], tmp_path: Path, key: str
) -> None:
    with pytest.raises(InvalidConfig, match=f"{key} = '{tmp_path / 'none'}': no such file"):
        load({**pem, key: str(tmp_path / "none")})
    with pytest.raises(InvalidConfig, match=f"{key} = '{tmp_path}': not a regular file"):
        load({**pem, key: str(tmp_path)})


def test_files_must_be_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = touch(tmp_path / "passwd")
    secret.chmod(0)
    if os.geteuid() == 0:  # root reads every file: make this one refuse anyway
        opener = Path.open

        def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
            if self == secret:
                raise PermissionError(13, "Permission denied", str(self))
            return opener(self, *args, **kwargs)

        monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(InvalidConfig, match="cannot be read"):
        load({"auth.password_file": str(secret)})


def test_a_password_file_makes_anonymous_access_optional(tmp_path: Path) -> None:
    config = load_config(None, {"auth.password_file": str(touch(tmp_path / "passwd"))})
    assert config.auth == AuthConfig(False, tmp_path / "passwd", None)


# --------------------------------------------------------------------- the file itself


def test_unknown_keys_are_refused_with_the_known_ones(tmp_path: Path) -> None:
    path = toml(tmp_path, "[limits]\nrecieve_maximum = 5\n")
    with pytest.raises(InvalidConfig) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: unknown key 'limits.recieve_maximum'")
    assert "did you mean limits.receive_maximum?" in message
    assert "known keys: limits.receive_maximum, limits.topic_alias_maximum" in message
    assert "auth.allow_anonymous" not in message  # only the section's own keys


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("[listener]\nmqtt = 'a:1'\n", "unknown section [listener] (did you mean [listeners]?)"),
        (
            "[tls]\n",
            "known sections: [auth], [cluster], [http], [limits], [listeners], [listeners.tls],"
            " [listeners.ws], [log],"
            " [metrics], [retention], [shared_subscriptions], [storage]",
        ),
        ("port = 1883\n", "unknown key 'port'; known keys: listeners.mqtt, listeners.tls.address"),
        ("[listeners.tls]\nport = 1\n", "unknown key 'listeners.tls.port'"),
        ("limits = 5\n", "limits must be a table ([limits]), not 5"),
        (
            "[limits.receive_maximum]\nx = 1\n",
            "limits.receive_maximum must be a value, not a table",
        ),
        ("[limits\n", "is not valid TOML: "),
        ("a = \n", "line 1"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, rule: str) -> None:
    path = toml(tmp_path, text)
    with pytest.raises(InvalidConfig, match=re.escape(rule)) as caught:
        load_config(path, ANONYMOUS)
    assert str(path) in str(caught.value)


def test_unknown_override_keys_are_refused() -> None:
    with pytest.raises(InvalidConfig, match=r"command line: unknown key 'limits\.queue'"):
        load({"limits.queue": 5})


def test_missing_and_unreadable_config_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match=r"config file .*none\.toml' does not exist"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(InvalidConfig, match="cannot be read"):
        load_config(tmp_path)
    (tmp_path / "latin1.toml").write_bytes(b"# j\xf6rg\n")
    with pytest.raises(InvalidConfig, match="is not valid TOML"):
        load_config(tmp_path / "latin1.toml")


# --------------------------------------------------------------------- built in code


@pytest.mark.parametrize(
    ("build", "rule"),
    [
        (lambda: Limits(receive_maximum=0), "limits.receive_maximum = 0: must be"),
        (lambda: Limits(max_inflight=70000), "limits.max_inflight = 70000"),
        (lambda: Limits(slow_consumer_timeout=0), "limits.slow_consumer_timeout = 0: must"),
        (lambda: Limits(connect_timeout=0), "limits.connect_timeout = 0: must"),
        (lambda: Limits(write_buffer_limit=100), "limits.write_buffer_limit = 100: must"),
        (lambda: Limits(default_session_expiry=10, max_session_expiry=5), "more than"),
        (lambda: StorageConfig("ftp://x"), "storage.url = 'ftp://x'"),
        (lambda: AuthConfig(password_file=Path("/nonexistent")), "no such file"),
        (lambda: Listeners(mqtt="127.0.0.1:1883"), "must be Address, not str"),  # type: ignore[arg-type]
        (lambda: Limits(receive_maximum="5"), "= '5': must be int, not str"),  # type: ignore[arg-type]
        (lambda: AuthConfig(allow_anonymous=1), "must be true or false"),  # type: ignore[arg-type]
    ],
)
def test_config_built_in_code_checks_itself(build: Any, rule: str) -> None:
    with pytest.raises(InvalidConfig, match=re.escape(rule)):
        build()


def test_configs_are_frozen() -> None:
    config = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.limits.receive_maximum = 5  # type: ignore[misc]
