"""Flow-control limits (``deadman.limits``) as the store reads and writes them: the
``Limit`` record with its live state, and the statements of both stores (their
parameters come from :class:`deadman.spec.LimitSpec`; the rows become ``Limit``
here, once for sync and async)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from deadman.bounds import LIMITS_LISTED_MAX
from deadman.store.async_base import AsyncBase


@dataclass(frozen=True)
class Limit:
    """A key's limit and its live state: ``running`` jobs with the key now (the slots
    held), ``available`` starts the rate allows now (None without a rate)."""

    key: str
    concurrency: int | None
    rate_count: int | None
    rate_per_ms: int | None
    running: int
    available: int | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Limit:
        available = row["available"]
        return cls(
            key=row["key"],
            concurrency=row["concurrency"],
            rate_count=row["rate_count"],
            rate_per_ms=row["rate_per_ms"],
            running=int(row["running"]),
            available=None if available is None else int(available),
        )


@dataclass(frozen=True)
class LimitParams:
    """What limit_put stores (built by deadman.spec.LimitSpec.params)."""

    key: str
    concurrency: int | None
    rate_count: int | None
    rate_per_ms: int | None


def limit_params(p: LimitParams) -> dict[str, Any]:
    return asdict(p)


def limits_of(rows: list[Any]) -> list[Limit]:
    return [Limit.from_row(r) for r in rows]


def list_params() -> dict[str, Any]:
    return {"cap": LIMITS_LISTED_MAX}


class LimitStore(AsyncBase):
    """The limit statements for the API (async)."""

    async def limit_put(self, p: LimitParams) -> Limit:
        return limits_of(await self._all("limit_put", limit_params(p)))[0]

    async def limit_list(self) -> list[Limit]:
        return limits_of(await self._all("limit_list", list_params()))

    async def limit_get(self, key: str) -> Limit | None:
        found = limits_of(await self._all("limit_get", {"key": key}))
        return found[0] if found else None

    async def limit_delete(self, key: str) -> bool:
        return bool(await self._all("limit_delete", {"key": key}))
