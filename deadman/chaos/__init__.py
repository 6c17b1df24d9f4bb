"""The chaos harness (``deadman chaos``): real worker processes, real signals, a real
Postgres restarted under them, and a verifier in plain SQL that says whether every
acknowledged job ran to exactly one effect.

- ``app``: the handler the chaos jobs run (records each invocation, then its effect).
- ``options``: the run's options and the environment its workers get.
- ``databases``: the private cluster or ``--database-url``, migrated, checked empty.
- ``probe``: the harness's questions to the database (``ops.sql``) while a run goes on.
- ``faults``: the fault schedule, reproducible from ``--seed``.
- ``kills``: a tick of the schedule applied (SIGKILLs, connection kills).
- ``workers``: the worker processes the harness owns (spawn, SIGKILL, SIGSTOP, RSS).
- ``scenarios``: the fault episodes (zombie, Postgres restart, partition) and their thread.
- ``netns``: the network namespace, veth and forwarder a partitioned worker sits behind.
- ``hosts``: three such namespaces as hosts, one on a clock hours off (libfaketime);
  ``hosts_scenario`` runs the load phase on them (``--hosts``: one host cut off and
  healed; ``hosts.sql``), ``hosts_app`` is the skewed workers' app (in the test).
- ``submit`` and ``http``: the two submission paths (Python client, ``deadman serve``).
- ``load``: the load phase (fleet, submitter, episodes, the tick loop, the drain).
- ``verify``: the checks, from the named queries in ``verify.sql``.
- ``limits``: the ``limits`` scenario's keys, their limits (set before the load) and
  the seeded draw of each job's key; ``verify_limits`` judges the attempt history
  against them (``verify_limits.sql``).
- ``checks``: what the harness itself saw, judged.
- ``report``: the header, the JSON report and the text printed from it.
- ``operators``: operators under fire (cancel, retry, bulk replay, pause, one-second
  retention) in a database of its own; ``verify_ops`` judges it (``verify_ops.sql``).
  Its parts: ``ops_config`` (queues, retention, pace), ``ops_journal`` (the actions
  with the database clock around each), ``ops_submit`` (its submissions),
  ``ops_actions`` (the actions), ``ops_operator`` (the thread that does it all).
- ``harness``: the phases in order, the verdict, the clean-up.
"""
