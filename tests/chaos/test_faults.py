"""The fault schedule is a pure function of the seed (no database, no processes)."""

from __future__ import annotations

from deadman.chaos.faults import FaultPlan


def plan(seed: int = 1, *, kill: bool = True, conn_kill: bool = True) -> FaultPlan:
    return FaultPlan(seed=seed, workers=4, kill_rate=0.3, kill=kill, conn_kill=conn_kill)


def test_same_seed_same_schedule_whatever_the_order_ticks_are_asked_in() -> None:
    forward = [plan().tick(i) for i in range(50)]
    backward = [plan().tick(i) for i in reversed(range(50))][::-1]
    assert forward == backward
    assert plan().episode_slot("zombie") == plan().episode_slot("zombie")


def test_another_seed_another_schedule() -> None:
    assert [plan(1).tick(i).kills for i in range(50)] != [plan(2).tick(i).kills for i in range(50)]


def test_switching_a_scenario_off_does_not_move_the_others() -> None:
    both, kills_only = plan(), plan(conn_kill=False)
    for i in range(50):
        assert both.tick(i).kills == kills_only.tick(i).kills
        assert kills_only.tick(i).conn_kills == 0
    assert all(plan(kill=False).tick(i).kills == () for i in range(50))


def test_kill_rate_is_roughly_honoured() -> None:
    p = plan()
    kills = sum(len(p.tick(i).kills) for i in range(1000))
    assert 0.25 * 4000 < kills < 0.35 * 4000  # 1000 ticks x 4 workers at 0.3


def test_pick_is_reproducible_and_bounded() -> None:
    p = plan()
    tick = p.tick(3)
    backends = [5, 9, 2, 7]
    assert p.pick(tick, backends, 2) == p.pick(tick, list(reversed(backends)), 2)
    assert len(p.pick(tick, backends, 10)) == 4
    assert p.pick(tick, [], 2) == []


def test_zombie_and_partition_pick_different_workers() -> None:
    for seed in range(50):
        p = plan(seed)
        assert p.episode_slot("zombie") != p.episode_slot("partition")
    single = FaultPlan(seed=1, workers=1, kill_rate=0.3, kill=True, conn_kill=True)
    assert single.episode_slot("zombie") == single.episode_slot("partition") == 0
