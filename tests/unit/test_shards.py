"""The shard map (``DEADMAN_SHARDS``) refuses every malformed map whole, naming the
variable and the fault; routing by queue and by id; what the router refuses before it
connects anywhere. No database: the urls here point at nothing."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pytest

from deadman.cli_shards import cmd_shards
from deadman.errors import ConfigError
from deadman.shards import (
    CrossShard,
    ShardedClient,
    ShardMap,
    ShardUnavailable,
    UnknownShard,
    UnroutedQueue,
    id_range,
    routing,
    shard_index_of,
)
from deadman.shards.ids import MAX_INDEX
from tests.helpers import wait_for

#: nothing listens on port 1: a connection is refused at once
NOWHERE = "postgresql://127.0.0.1:1/{}?connect_timeout=1"


def _map(**shards: Any) -> str:
    return json.dumps(shards)


def _shard(index: int, queues: list[Any], url: str | None = None) -> dict[str, Any]:
    return {"index": index, "url": url or NOWHERE.format(index), "queues": queues}


GOOD = _map(a=_shard(1, ["alpha", "mail"]), b=_shard(2, ["beta", "*"]))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is not JSON"),
        ("default,mail=postgresql://a/db;payments=postgresql://b/db", "is not JSON"),
        ("{", "is not JSON"),
        ("[" * 100_000, "is not JSON"),
        ("[]", "must be a JSON object"),
        ('"a"', "must be a JSON object"),
        ("null", "must be a JSON object"),
        ("{}", "must be a JSON object"),
        (_map(A=_shard(1, ["q"])), "shard name 'A'"),
        (json.dumps({"": _shard(1, ["q"])}), "shard name ''"),
        (_map(**{"a" * 41: _shard(1, ["q"])}), "is not 1-40"),
        (_map(a="postgresql://x/db"), "must be an object"),
        (_map(a={"url": "u", "queues": ["q"]}), "missing index"),
        (_map(a={**_shard(1, ["q"]), "weight": 2}), "unknown weight"),
        (_map(a={"index": 1}), "missing queues, url"),
        (_map(a=_shard(-1, ["q"])), "index must be an integer from 0 to 31"),
        (_map(a=_shard(32, ["q"])), "index must be an integer from 0 to 31"),
        (_map(a={**_shard(1, ["q"]), "index": True}), "index must be an integer"),
        (_map(a={**_shard(1, ["q"]), "index": 1.0}), "index must be an integer"),
        (_map(a={**_shard(1, ["q"]), "index": "1"}), "index must be an integer"),
        (_map(a={**_shard(1, ["q"]), "index": 2**70}), "index must be an integer"),
        (_map(a=_shard(1, ["q"], url=" ")), "url must be a non-empty string"),
        (_map(a={**_shard(1, ["q"]), "url": 5}), "url must be a non-empty string"),
        (_map(a=_shard(1, [])), "queues must be a non-empty list"),
        (_map(a={**_shard(1, ["q"]), "queues": "q"}), "queues must be a non-empty list"),
        (_map(a=_shard(1, ["bad queue"])), "'bad queue' is not a queue name"),
        (_map(a=_shard(1, ["x" * 129])), "is not a queue name"),
        (_map(a=_shard(1, [7])), "7 is not a queue name"),
        (_map(a=_shard(1, ["**"])), "'\\*\\*' is not a queue name"),
        (_map(a=_shard(1, ["q", "q"])), "a queue is listed twice"),
        (_map(a=_shard(1, ["q"]), b=_shard(2, ["r", "q"])), "queue 'q' is in two shards: a and b"),
        (_map(a=_shard(1, ["*"]), b=_shard(2, ["*"])), "the fallback '\\*' is in two shards"),
        (_map(a=_shard(1, ["q"]), b=_shard(1, ["r"])), "shards a and b have the same index"),
        (
            _map(
                a=_shard(1, ["q"], url="postgresql://h/db"), b=_shard(2, ["r"], "postgresql://h/db")
            ),
            "shards a and b have the same url",
        ),
    ],
)
def test_a_malformed_map_is_refused_whole(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"^DEADMAN_SHARDS .*{says}"):
        ShardMap.parse(text)


def test_the_map_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="DEADMAN_SHARDS is not set"):
        ShardMap.from_env({"DEADMAN_SHARDS": ""})
    monkeypatch.delenv("DEADMAN_SHARDS", raising=False)
    with pytest.raises(ConfigError, match="DEADMAN_SHARDS is not set"):
        ShardedClient()


def test_a_dsn_keeps_every_character_json_quotes() -> None:
    url = "postgresql://u:p%3Bw=d;x@h:5432/db?options=-c%20a%3Db&sslmode=require"
    shard_map = ShardMap.parse(_map(a=_shard(3, ["q", "*"], url=url)))
    assert shard_map.named("a").url == url


def test_routing_by_queue_names_first_then_the_fallback() -> None:
    shard_map = ShardMap.parse(GOOD)
    assert shard_map.for_queue("mail").name == "a"
    assert shard_map.for_queue("beta").name == "b"
    assert shard_map.for_queue("anything-else").name == "b"  # '*'


def test_an_unknown_queue_without_a_fallback_is_refused() -> None:
    shard_map = ShardMap.parse(_map(a=_shard(1, ["alpha"]), b=_shard(2, ["beta"])))
    with pytest.raises(UnroutedQueue, match=r"no shard holds queue 'gamma'.*no '\*' fallback"):
        shard_map.for_queue("gamma")


def test_an_id_names_its_shard_at_both_ends_of_each_range() -> None:
    shard_map = ShardMap.parse(_map(z=_shard(0, ["z"]), a=_shard(1, ["a"]), l=_shard(31, ["l"])))
    assert id_range(0) == (1, 2**48 - 1)
    assert id_range(MAX_INDEX)[1] == 2**53 - 1  # still exact as a JavaScript number
    for index, name in ((0, "z"), (1, "a"), (31, "l")):
        first, last = id_range(index)
        assert shard_index_of(first) == shard_index_of(last) == index
        assert shard_map.for_id(first).name == shard_map.for_id(last).name == name
    with pytest.raises(UnknownShard, match="shard index 2, which is in no shard"):
        shard_map.for_id(id_range(2)[0])
    with pytest.raises(ValueError, match=r"not in 0\.\.31"):
        id_range(32)


def test_the_router_refuses_before_it_connects() -> None:
    """Cross-shard requests are refused from the map alone: the urls point at nothing,
    so reaching a database would raise ShardUnavailable instead."""
    with ShardedClient(ShardMap.parse(GOOD), timeout=1.0) as client:
        alpha, beta = client.job("noop", queue="alpha"), client.job("noop", queue="beta")
        with pytest.raises(CrossShard, match="batch spans shards \\(alpha -> a, beta -> b\\)"):
            client.enqueue_many([alpha, beta])
        with pytest.raises(CrossShard, match="workflow w spans shards"):
            client.workflow("w", {"x": alpha, "y": beta}, [("x", "y")])
        on_b = id_range(2)[0] + 5
        with pytest.raises(CrossShard, match=f"cannot depend on job {on_b} of shard b"):
            client.enqueue("noop", queue="alpha", depends_on=[on_b])
        with pytest.raises(UnknownShard):
            client.get(id_range(7)[0])
        assert client.enqueue_many([]) == []
        assert {s.name: len(g) for s, g in client.by_shard([alpha, beta, alpha]).items()} == {
            "a": 2,
            "b": 1,
        }


def test_an_unreachable_shard_is_unavailable_by_name() -> None:
    with ShardedClient(ShardMap.parse(GOOD), timeout=1.0) as client:
        with pytest.raises(ShardUnavailable, match=r"^shard a \(index 1, queues alpha, mail\)"):
            client.enqueue("noop", queue="mail")
        # then it rests: refused at once, without a connection attempt, for PAUSE_S
        with pytest.raises(ShardUnavailable, match=r"failed less than 1 s ago; next try in"):
            client.get(id_range(1)[0])
        with pytest.raises(ShardUnavailable, match=r"^shard b .*Connection refused"):
            client.enqueue("noop", queue="beta")  # the other shard is not resting


def test_a_resting_shard_is_tried_again_after_the_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "PAUSE_S", 0.3)
    with ShardedClient(ShardMap.parse(GOOD), timeout=1.0) as client:
        with pytest.raises(ShardUnavailable, match="Connection refused"):
            client.enqueue("noop", queue="mail")
        failed_at = time.monotonic()
        with pytest.raises(ShardUnavailable, match="next try in"):
            client.enqueue("noop", queue="mail")
        assert time.monotonic() - failed_at < 0.3  # (else the refusal above proves nothing)

        def tried_again() -> bool:
            try:
                client.enqueue("noop", queue="mail")
            except ShardUnavailable as exc:
                return "Connection refused" in str(exc)
            raise AssertionError("a shard on port 1 answered")

        wait_for(tried_again, 5.0, interval=0.05, message="a connection attempt again")
        assert time.monotonic() - failed_at >= 0.3


def test_shards_init_reports_every_shard_and_exits_unavailable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DEADMAN_SHARDS", GOOD)
    assert cmd_shards(argparse.Namespace(check_only=False)) == 3
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["shard"], x["ok"]) for x in lines] == [("a", False), ("b", False)]
    assert all(x["error"].startswith("unavailable: ") for x in lines)
    monkeypatch.setenv("DEADMAN_SHARDS", "{nope")
    with pytest.raises(ConfigError, match="DEADMAN_SHARDS is not JSON"):
        cmd_shards(argparse.Namespace(check_only=True))
