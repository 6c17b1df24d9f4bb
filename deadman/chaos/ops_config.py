"""What the operators scenario is set to: its queues, retention, pace and mix of
actions, and the share of ``--jobs`` it takes."""

from __future__ import annotations

from dataclasses import dataclass

from deadman.chaos.options import Options
from deadman.model import Backoff

QUEUES = ("ops-a", "ops-b", "ops-c")
PAUSABLE = ("ops-a", "ops-b")  # ops-c always runs: the fleet never idles completely
#: Retention for every finished state, and how often the scenario's pruner runs.
RETENTION_MS = 1000
PRUNE_EVERY_S = 1.0
#: The operator acts until the submissions are in and the fleet is nearly through
#: them (OPERATE_UNTIL_LEFT of the jobs unfinished), at least OPERATE_TAIL_S after
#: the last submission; replays keep feeding it work, so OPERATE_MAX_S at most.
OPERATE_TAIL_S = 3.0
OPERATE_UNTIL_LEFT = 0.02
OPERATE_MAX_S = 25.0
#: Pause between two operator actions (each is a list and an act: ~40 actions/s).
STEP_S = 0.01
BACKOFF = Backoff(strategy="exponential", base_ms=50, max_ms=500)
#: (action, weight): what the operator does next, drawn from the seed.
ACTIONS = (
    ("cancel-queued", 3.0),
    ("cancel-running", 4.0),
    ("retry-dead", 4.0),
    ("retry-cancelled", 2.0),
    ("replay-dead", 1.0),
    ("replay-while-pruning", 1.0),
    ("cancel-workflow", 1.0),
)
PAUSE_P = 0.03  # per action and pausable queue that is running


def scaled_jobs(jobs: int, alone: bool) -> int:
    """The scenario's own job count: all of --jobs when it runs alone; in --all a
    tenth of it (1000 at least), so that it adds tens of seconds to a 100k run."""
    return jobs if alone else min(jobs, max(1000, jobs // 10))


@dataclass(frozen=True)
class OperatorsConfig:
    """The run's options, and the scenario's own job count (``scaled_jobs``)."""

    opts: Options
    jobs: int

    @property
    def prefix(self) -> str:
        return f"chaos-ops-{self.opts.seed}-"

    @property
    def workflows(self) -> int:
        return max(5, self.jobs // 40)
