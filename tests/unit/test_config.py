"""Settings: working defaults, every DEADMAN_* variable parsed, nonsense refused with
a message that names the variable."""

from __future__ import annotations

import dataclasses

import pytest

from deadman.config import Settings, connection_settings
from deadman.db.pool import async_pool, prepare_threshold, sync_pool
from deadman.errors import ConfigError


def test_defaults_are_valid() -> None:
    s = Settings()
    assert s.lease_ttl_s == 10.0
    assert s.heartbeat_s * 2 <= s.lease_ttl_s
    assert s.queues == ("default",)
    assert s.database_url is None
    assert s.api_token is None
    assert Settings.from_env({}) == s


def test_from_env_reads_os_environ_when_no_mapping_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEADMAN_CONCURRENCY", "7")
    assert Settings.from_env().concurrency == 7


PARSED: list[tuple[str, str, object]] = [
    ("DEADMAN_DATABASE_URL", "postgresql://u@h:5433/db", "postgresql://u@h:5433/db"),
    ("DEADMAN_LEASE_TTL_S", "30", 30.0),
    ("DEADMAN_HEARTBEAT_S", "1.5", 1.5),
    ("DEADMAN_RESCUE_S", "0.25", 0.25),
    ("DEADMAN_POLL_S", "3", 3.0),
    ("DEADMAN_CONCURRENCY", "32", 32),
    ("DEADMAN_QUEUES", " a, b ,,c ", ("a", "b", "c")),
    ("DEADMAN_MAX_ATTEMPTS", "9", 9),
    ("DEADMAN_MAX_RESCUES", "0", 0),
    ("DEADMAN_SHUTDOWN_GRACE_S", "0", 0.0),
    ("DEADMAN_API_TOKEN", "s3cret", "s3cret"),
    ("DEADMAN_MAX_PAYLOAD_BYTES", "2048", 2048),
    ("DEADMAN_MAX_QUEUE_DEPTH", "1000", 1000),
    ("DEADMAN_RETENTION_SUCCEEDED_S", "60", 60.0),
    ("DEADMAN_RETENTION_FAILED_S", "120.5", 120.5),
    ("DEADMAN_VACUUM_DEAD_TUPLES", "0", 0),
    ("DEADMAN_COMPLETER_BATCH", "50", 50),
    ("DEADMAN_COMPLETER_FLUSHES", "3", 3),
    ("DEADMAN_CLAIM_BATCH", "40", 40),
    ("DEADMAN_HANDOFF_SLOTS", "0", 0),
    ("DEADMAN_POOL_SIZE", "8", 8),
    ("DEADMAN_HANDLER_POOL_SIZE", "64", 64),
    ("DEADMAN_LOG_FORMAT", "json", "json"),
    ("DEADMAN_LOG_LEVEL", "debug", "debug"),
    ("DEADMAN_STARTUP_WAIT_S", "90", 90.0),
    ("DEADMAN_PREPARE", "off", False),
    ("DEADMAN_LISTEN", "OFF", False),
    ("DEADMAN_LISTEN_URL", "postgresql://u@pg:5432/db", "postgresql://u@pg:5432/db"),
    ("DEADMAN_EVENT_LOOP", "asyncio", "asyncio"),
    ("DEADMAN_ACCESS_LOG", "on", True),
    ("DEADMAN_GC", "python", "python"),
]


def test_every_setting_has_a_parse_case() -> None:
    tested = {var for var, _, _ in PARSED}
    assert tested == {"DEADMAN_" + f.name.upper() for f in dataclasses.fields(Settings)}


@pytest.mark.parametrize(("var", "raw", "expected"), PARSED, ids=[v for v, _, _ in PARSED])
def test_each_variable_is_parsed(var: str, raw: str, expected: object) -> None:
    s = Settings.from_env({var: raw})
    assert getattr(s, var.removeprefix("DEADMAN_").lower()) == expected


@pytest.mark.parametrize("raw", ["off", "none", "0"])
def test_max_queue_depth_can_be_switched_off(raw: str) -> None:
    assert Settings.from_env({"DEADMAN_MAX_QUEUE_DEPTH": raw}).max_queue_depth is None


@pytest.mark.parametrize("raw", ["", "   "])
def test_blank_variables_mean_the_default(raw: str) -> None:
    assert Settings.from_env({"DEADMAN_CONCURRENCY": raw, "DEADMAN_QUEUES": raw}) == Settings()


def test_overrides_win_over_the_environment_and_none_is_ignored() -> None:
    env = {"DEADMAN_CONCURRENCY": "3", "DEADMAN_MAX_ATTEMPTS": "4"}
    s = Settings.from_env(env, concurrency=5, max_attempts=None)
    assert (s.concurrency, s.max_attempts) == (5, 4)


def test_with_returns_a_new_validated_copy() -> None:
    s = Settings()
    assert s.with_(concurrency=2).concurrency == 2
    assert s.concurrency == 200
    with pytest.raises(ConfigError, match="DEADMAN_CONCURRENCY"):
        s.with_(concurrency=0)


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().concurrency = 3  # type: ignore[misc]


def test_heartbeat_at_exactly_half_the_ttl_is_accepted() -> None:
    s = Settings.from_env({"DEADMAN_LEASE_TTL_S": "10", "DEADMAN_HEARTBEAT_S": "5"})
    assert s.heartbeat_s == 5.0


def test_heartbeat_over_half_the_ttl_is_rejected() -> None:
    with pytest.raises(ConfigError, match="DEADMAN_HEARTBEAT_S") as excinfo:
        Settings.from_env({"DEADMAN_LEASE_TTL_S": "10", "DEADMAN_HEARTBEAT_S": "5.01"})
    assert "DEADMAN_LEASE_TTL_S" in str(excinfo.value)


NONSENSE: list[tuple[str, str]] = [
    ("DEADMAN_LEASE_TTL_S", "ten"),
    ("DEADMAN_LEASE_TTL_S", "0"),
    ("DEADMAN_LEASE_TTL_S", "-5"),
    ("DEADMAN_LEASE_TTL_S", "nan"),
    ("DEADMAN_HEARTBEAT_S", "0"),
    ("DEADMAN_HEARTBEAT_S", "2s"),
    ("DEADMAN_RESCUE_S", "0"),
    ("DEADMAN_POLL_S", "-1"),
    ("DEADMAN_CONCURRENCY", "0"),
    ("DEADMAN_CONCURRENCY", "10001"),
    ("DEADMAN_CONCURRENCY", "1.5"),
    ("DEADMAN_CONCURRENCY", "many"),
    ("DEADMAN_QUEUES", ","),
    ("DEADMAN_QUEUES", " , ,"),
    ("DEADMAN_MAX_ATTEMPTS", "0"),
    ("DEADMAN_MAX_ATTEMPTS", "101"),
    ("DEADMAN_MAX_RESCUES", "-1"),
    ("DEADMAN_MAX_RESCUES", "1001"),
    ("DEADMAN_SHUTDOWN_GRACE_S", "-1"),
    ("DEADMAN_MAX_PAYLOAD_BYTES", "0"),
    ("DEADMAN_MAX_PAYLOAD_BYTES", "1MB"),
    ("DEADMAN_MAX_QUEUE_DEPTH", "-5"),
    ("DEADMAN_MAX_QUEUE_DEPTH", "lots"),
    ("DEADMAN_RETENTION_SUCCEEDED_S", "a day"),
    ("DEADMAN_VACUUM_DEAD_TUPLES", "-1"),
    ("DEADMAN_VACUUM_DEAD_TUPLES", "10k"),
    ("DEADMAN_VACUUM_DEAD_TUPLES", "1e4"),
    ("DEADMAN_COMPLETER_BATCH", "0"),
    ("DEADMAN_COMPLETER_FLUSHES", "0"),
    ("DEADMAN_CLAIM_BATCH", "-1"),
    ("DEADMAN_HANDOFF_SLOTS", "-1"),
    ("DEADMAN_POOL_SIZE", "-1"),
    ("DEADMAN_HANDLER_POOL_SIZE", "-1"),
    ("DEADMAN_HANDLER_POOL_SIZE", "sixteen"),
    ("DEADMAN_LOG_FORMAT", "xml"),
]


@pytest.mark.parametrize(("var", "raw"), NONSENSE, ids=[f"{v}={r}" for v, r in NONSENSE])
def test_nonsense_is_rejected_naming_the_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        Settings.from_env({var: raw})
    assert var in str(excinfo.value)


def test_an_empty_api_token_is_rejected() -> None:
    with pytest.raises(ConfigError, match="DEADMAN_API_TOKEN"):
        Settings(api_token="")


def test_unparseable_value_keeps_the_cause() -> None:
    with pytest.raises(ConfigError, match=r"DEADMAN_POLL_S='soon' is not valid") as excinfo:
        Settings.from_env({"DEADMAN_POLL_S": "soon"})
    assert isinstance(excinfo.value.__cause__, ValueError)


def test_lease_margin_is_below_the_ttl() -> None:
    assert Settings(lease_ttl_s=2, heartbeat_s=0.5).lease_margin_s == 0.5
    assert Settings(lease_ttl_s=10, heartbeat_s=4).lease_margin_s == 2.5


# ------------------------------------------------------------- nonsense still accepted


def test_infinite_lease_ttl_is_rejected() -> None:
    with pytest.raises(ConfigError, match="DEADMAN_LEASE_TTL_S"):
        Settings.from_env({"DEADMAN_LEASE_TTL_S": "inf"})


@pytest.mark.parametrize(
    ("var", "raw"),
    [("DEADMAN_RETENTION_SUCCEEDED_S", "-3600"), ("DEADMAN_RETENTION_FAILED_S", "nan")],
)
def test_nonsense_retention_is_rejected(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var):
        Settings.from_env({var: raw})


def test_invalid_queue_names_are_rejected() -> None:
    with pytest.raises(ConfigError, match="DEADMAN_QUEUES"):
        Settings.from_env({"DEADMAN_QUEUES": "default,bad queue"})


# ------------------------------------------------------------- hostile values


def test_startup_wait_defaults_to_forever_and_zero_means_one_try() -> None:
    assert Settings().startup_wait_s is None
    assert Settings.from_env({"DEADMAN_STARTUP_WAIT_S": "forever"}).startup_wait_s is None
    assert Settings.from_env({"DEADMAN_STARTUP_WAIT_S": "0"}).startup_wait_s == 0.0


def _every_variable() -> list[str]:
    return ["DEADMAN_" + f.name.upper() for f in dataclasses.fields(Settings)]


#: Values no setting accepts (whitespace alone means "the default": compose's VAR=).
#: os.environ turns bytes that are not UTF-8 into lone surrogates (surrogateescape).
HOSTILE = ["\udcff", "caf\udce9", "a\x1bb", "tab\there"]
#: Values a string setting may hold but a number must refuse (Arabic-Indic digits:
#: int() and float() take them).
NOT_NUMBERS = ["²", "nan", "NaN", "inf", "-inf", "1e999", "-1e309", "\u0661\u0660", "1_000"]
NOT_NUMBERS += ["9" * 5000, "0x10", "1e5000", "+-1", "--1", "1.5.5"]
STRINGS = {
    "DEADMAN_DATABASE_URL",
    "DEADMAN_API_TOKEN",
    "DEADMAN_QUEUES",
    "DEADMAN_LOG_FORMAT",
    "DEADMAN_LOG_LEVEL",
    "DEADMAN_LISTEN_URL",
}
HOSTILE_CASES = [(v, raw) for v in _every_variable() for raw in HOSTILE] + [
    (v, raw) for v in _every_variable() if v not in STRINGS for raw in NOT_NUMBERS
]


@pytest.mark.parametrize(
    ("var", "raw"), HOSTILE_CASES, ids=[f"{v}={r[:12]!r}" for v, r in HOSTILE_CASES]
)
def test_hostile_values_are_refused_naming_the_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        Settings.from_env({var: raw})
    message = str(excinfo.value)
    assert var in message
    assert len(message) < 300, "an overlong value must not be echoed whole"
    message.encode("utf-8")  # printable on any terminal: no lone surrogate in it


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("DEADMAN_LEASE_TTL_S", "1e300"),
        ("DEADMAN_HEARTBEAT_S", "0.000001"),
        ("DEADMAN_RESCUE_S", "1e-300"),
        ("DEADMAN_POLL_S", "99999999"),
        ("DEADMAN_SHUTDOWN_GRACE_S", "1e300"),
        ("DEADMAN_RETENTION_SUCCEEDED_S", "1e300"),
        ("DEADMAN_RETENTION_FAILED_S", "1e18"),
        ("DEADMAN_VACUUM_DEAD_TUPLES", "9223372036854775807"),
        ("DEADMAN_VACUUM_DEAD_TUPLES", "\u0661\u0660"),  # Arabic-Indic digits
        ("DEADMAN_VACUUM_DEAD_TUPLES", "off; VACUUM FULL"),
        ("DEADMAN_MAX_PAYLOAD_BYTES", "99999999999999"),
        ("DEADMAN_MAX_QUEUE_DEPTH", "9223372036854775807"),
        ("DEADMAN_COMPLETER_BATCH", "9223372036854775807"),
        ("DEADMAN_COMPLETER_FLUSHES", "100000"),
        ("DEADMAN_CLAIM_BATCH", "9223372036854775807"),
        ("DEADMAN_POOL_SIZE", "1000000"),
        ("DEADMAN_HANDLER_POOL_SIZE", "10001"),
        ("DEADMAN_STARTUP_WAIT_S", "-1"),
        ("DEADMAN_STARTUP_WAIT_S", "1e300"),
        ("DEADMAN_LOG_LEVEL", "verbose"),
        ("DEADMAN_API_TOKEN", "tok en"),
        ("DEADMAN_API_TOKEN", "tökén"),
        ("DEADMAN_API_TOKEN", "x" * 5000),
        ("DEADMAN_QUEUES", ",".join(f"q{i}" for i in range(1001))),
        ("DEADMAN_QUEUES", "mail,\u00e9t\u00e9"),
        ("DEADMAN_DATABASE_URL", "host=db port=99999"),
        ("DEADMAN_DATABASE_URL", "postgresql://u@h:0/db"),
        ("DEADMAN_DATABASE_URL", "host='unterminated"),
        ("DEADMAN_DATABASE_URL", "not a connection string"),
        ("DEADMAN_DATABASE_URL", "postgresql://u@h/" + "d" * 9000),
        ("DEADMAN_PREPARE", "of"),
        ("DEADMAN_PREPARE", "disable"),
        ("DEADMAN_PREPARE", "ON; DROP"),
        ("DEADMAN_PREPARE", "o\u0301ff"),
        ("DEADMAN_PREPARE", "\uff4f\uff46\uff46"),  # fullwidth 'off'
        ("DEADMAN_LISTEN", "2"),
        ("DEADMAN_LISTEN", "-1"),
        ("DEADMAN_LISTEN", "offf"),
        ("DEADMAN_LISTEN", "x" * 5000),
        ("DEADMAN_LISTEN_URL", "host=db port=99999"),
        ("DEADMAN_LISTEN_URL", "host='unterminated"),
        ("DEADMAN_LISTEN_URL", "not a connection string"),
        ("DEADMAN_LISTEN_URL", "postgresql://u@h/" + "d" * 9000),
        ("DEADMAN_LISTEN_URL", "postgresql://u:secret@h:0/db"),
        ("DEADMAN_EVENT_LOOP", "uvloop\u200b"),  # a zero-width space after it
        ("DEADMAN_EVENT_LOOP", "UVLOOP"),
        ("DEADMAN_EVENT_LOOP", "trio"),
        ("DEADMAN_EVENT_LOOP", "asyncio;uvloop"),
        ("DEADMAN_EVENT_LOOP", "x" * 5000),
        ("DEADMAN_ACCESS_LOG", "yes please"),
        ("DEADMAN_ACCESS_LOG", "2"),
        ("DEADMAN_GC", "TUNED"),
        ("DEADMAN_GC", "off"),
        ("DEADMAN_GC", "700,10,10"),
        ("DEADMAN_GC", "tuned\u200b"),
        ("DEADMAN_GC", "x" * 5000),
    ],
)
def test_huge_tiny_and_malformed_values_are_refused(var: str, raw: str) -> None:
    """Accepted before: a lease of 1e300 s overflows the bigint of milliseconds, a
    1e-300 s tick is a busy loop, an unknown log level crashed `serve` (uvicorn), a
    token with a space or a non-ASCII letter can never be sent, and a DSN libpq cannot
    parse failed as a traceback at the first connection."""
    with pytest.raises(ConfigError) as excinfo:
        Settings.from_env({var: raw})
    assert var in str(excinfo.value)
    assert "secret" not in str(excinfo.value)


def test_a_dsn_error_never_quotes_the_password() -> None:
    with pytest.raises(ConfigError) as excinfo:
        Settings.from_env({"DEADMAN_DATABASE_URL": "postgresql://u:hunter2@h:70000/db"})
    assert "hunter2" not in str(excinfo.value)


@pytest.mark.parametrize("raw", ["host=db port=5432,5433 dbname=x", "postgresql://u:p@h:5432/d"])
def test_valid_dsns_pass(raw: str) -> None:
    assert Settings.from_env({"DEADMAN_DATABASE_URL": raw}).database_url == raw


def test_bounds_at_the_edges_are_accepted() -> None:
    s = Settings.from_env(
        {
            "DEADMAN_LEASE_TTL_S": "86400",
            "DEADMAN_HEARTBEAT_S": "0.01",
            "DEADMAN_RESCUE_S": "0.01",
            "DEADMAN_COMPLETER_BATCH": "100000",
            "DEADMAN_POOL_SIZE": "1000",
            "DEADMAN_LOG_LEVEL": "WARNING",
            "DEADMAN_API_TOKEN": "Abc-._~+/=",
        }
    )
    assert (s.lease_ttl_s, s.heartbeat_s, s.pool_size) == (86400.0, 0.01, 1000)


# ------------------------------------------------------ PgBouncer (issue 17)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[("on", True), ("TRUE", True), ("yes", True), ("1", True)],
        *[("off", False), ("False", False), ("no", False), ("0", False)],
    ],
)
def test_prepare_and_listen_are_switches(raw: str, expected: bool) -> None:
    s = Settings.from_env({"DEADMAN_PREPARE": raw, "DEADMAN_LISTEN": raw})
    assert (s.prepare, s.listen) == (expected, expected)


def test_prepare_and_listen_default_on() -> None:
    s = Settings()
    assert (s.prepare, s.listen, s.listen_url) == (True, True, None)


def test_a_listen_url_with_listening_off_is_refused() -> None:
    """Two settings that contradict each other: one of them is a mistake."""
    with pytest.raises(ConfigError, match=r"DEADMAN_LISTEN_URL.*DEADMAN_LISTEN is off"):
        Settings.from_env({"DEADMAN_LISTEN": "off", "DEADMAN_LISTEN_URL": "host=pg"})


def test_a_listen_url_error_never_quotes_the_password() -> None:
    with pytest.raises(ConfigError, match="DEADMAN_LISTEN_URL") as excinfo:
        Settings.from_env({"DEADMAN_LISTEN_URL": "postgresql://u:hunter2@h:70000/db"})
    assert "hunter2" not in str(excinfo.value)


def test_connection_settings_read_only_their_own_variables() -> None:
    """What deadman/db/pool.py and the listeners read where a connection is made: the
    three connection variables, checked, and nothing else of the environment (a bad
    DEADMAN_CONCURRENCY is the start-up check's business, not every pool's)."""
    env = {
        "DEADMAN_PREPARE": "off",
        "DEADMAN_LISTEN_URL": "host=pg dbname=d",
        "DEADMAN_CONCURRENCY": "lots",
    }
    s = connection_settings(env)
    assert (s.prepare, s.listen, s.listen_url) == (False, True, "host=pg dbname=d")
    with pytest.raises(ConfigError, match="DEADMAN_PREPARE"):
        connection_settings({"DEADMAN_PREPARE": "maybe"})


@pytest.mark.parametrize(("raw", "threshold"), [("off", None), ("on", 5), (None, 5)])
def test_prepare_off_makes_every_pool_unprepared(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, threshold: int | None
) -> None:
    if raw is None:
        monkeypatch.delenv("DEADMAN_PREPARE", raising=False)
    else:
        monkeypatch.setenv("DEADMAN_PREPARE", raw)
    assert prepare_threshold() == threshold
    pool = sync_pool("host=127.0.0.1 port=1 connect_timeout=1", name="t", min_size=0)
    try:
        assert isinstance(pool.kwargs, dict)
        assert pool.kwargs["prepare_threshold"] == threshold
    finally:
        pool.close(timeout=0)
    apool = async_pool("host=127.0.0.1 port=1", name="t")
    assert isinstance(apool.kwargs, dict)
    assert apool.kwargs["prepare_threshold"] == threshold
    # an explicit argument wins over the environment
    assert prepare_threshold(False) is None
    assert prepare_threshold(True) == 5


def test_the_event_loop_setting_picks_the_loop() -> None:
    import asyncio

    import uvloop

    from deadman import eventloop

    async def kind() -> type[asyncio.AbstractEventLoop]:
        return type(asyncio.get_running_loop())

    assert Settings().event_loop == "auto"
    assert eventloop.run(kind, "auto") is uvloop.Loop
    assert eventloop.run(kind, "uvloop") is uvloop.Loop
    assert eventloop.run(kind, "asyncio") is not uvloop.Loop


def test_uvloop_asked_for_but_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from deadman import eventloop

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert eventloop.loop_factory("auto") is None
    with pytest.raises(ConfigError, match="DEADMAN_EVENT_LOOP"):
        eventloop.loop_factory("uvloop")


@pytest.mark.parametrize(
    ("concurrency", "setting", "expected"),
    [(200, 0, 16), (4, 0, 4), (200, 64, 64), (10, 64, 10), (1, 0, 1)],
)
def test_each_handler_pool_is_the_setting_or_min_concurrency_16_never_past_the_concurrency(
    concurrency: int, setting: int, expected: int
) -> None:
    from deadman.worker.process import handler_pool_size

    settings = Settings(concurrency=concurrency, handler_pool_size=setting)
    assert handler_pool_size(settings) == expected
