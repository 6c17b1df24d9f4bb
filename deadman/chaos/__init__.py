"""The chaos harness (``deadman chaos``): real worker processes, real signals, a real
Postgres restarted under them, and a verifier in plain SQL that says whether every
acknowledged job ran to exactly one effect.

- ``app``: the handler the chaos jobs run (records each invocation, then its effect).
- ``faults``: the fault schedule, reproducible from ``--seed``.
- ``workers``: the worker processes the harness owns (spawn, SIGKILL, SIGSTOP, RSS).
- ``scenarios``: the fault episodes (zombie, Postgres restart, partition).
- ``netns``: the network namespace, veth and forwarder a partitioned worker sits behind.
- ``submit`` and ``http``: the two submission paths (Python client, ``deadman serve``).
- ``verify``: the checks, from the named queries in ``verify.sql``.
- ``operators``: operators under fire (cancel, retry, bulk replay, pause, one-second
  retention) in a database of its own; ``verify_ops`` judges it (``verify_ops.sql``).
- ``harness``: orchestration and the report.
"""
