"""The checks of ``make test-compose`` against a stack that deploy/test_compose.sh
brought up with deploy/docker-compose.yml. Standard library only (it runs on the
host's Python); every wait is a poll with a deadline.

1. every service is up: postgres healthy, migrate exited 0, each API replica and each
   worker container healthy by its HEALTHCHECK, /ready 200 on every API replica;
2. jobs submitted through both API replicas all succeed (GET /jobs/{id});
3. a worker container is killed (SIGKILL) while it holds running jobs, and every one
   of them is rescued and succeeds in the other worker container (its attempts say
   where each ran);
4. Prometheus (--profile metrics, deploy/prometheus.yml) scrapes every API replica and
   every worker process, all targets up;
5. PgBouncer (--profile pgbouncer) answers a query in transaction pool mode.

Exit 0 when all hold; 1 with the first failure on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class CheckFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"[compose-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
    """Poll ``probe`` until it returns something other than None (or False)."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while True:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as exc:
            last_error = f" (last error: {exc})"
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout_s:g} s waiting for {what}{last_error}")
        time.sleep(0.25)  # a poll interval, not a guess at how long anything takes


class Stack:
    def __init__(self, compose: list[str]) -> None:
        self.compose = compose

    def run(self, *args: str) -> str:
        out = subprocess.run(
            [*self.compose, *args], check=True, capture_output=True, text=True, timeout=120
        )
        return out.stdout

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service).split()

    @staticmethod
    def inspect(container: str) -> dict[str, Any]:
        out = subprocess.run(
            ["docker", "inspect", container], check=True, capture_output=True, text=True
        )
        info: dict[str, Any] = json.loads(out.stdout)[0]
        return info

    def api_urls(self, replicas: int) -> list[str]:
        urls = []
        for i in range(1, replicas + 1):
            host_port = self.run("port", "--index", str(i), "api", "8080").strip()
            if not host_port:
                raise CheckFailed(f"api replica {i} publishes no port")
            urls.append(f"http://{host_port}")
        return urls


def http(method: str, url: str, body: object = None, timeout_s: float = 5) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if method == "POST":
        headers["Idempotency-Key"] = uuid.uuid4().hex
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def check_services(stack: Stack, api_replicas: int, worker_replicas: int) -> None:
    def healthy(service: str, n: int) -> bool:
        ids = stack.containers(service)
        states = [stack.inspect(c)["State"] for c in ids]
        bad = [s for s in states if s.get("Health", {}).get("Status") != "healthy"]
        if any(not s["Running"] for s in states):
            raise CheckFailed(f"a {service} container stopped: {states}")
        return len(ids) == n and not bad

    for service, n in (("postgres", 1), ("api", api_replicas), ("worker", worker_replicas)):
        wait_for(f"{n} healthy {service} container(s)", lambda s=service, n=n: healthy(s, n), 120)
        log(f"{service}: {n} container(s) healthy (HEALTHCHECK)")
    ids = stack.run("ps", "-a", "-q", "migrate").split()
    states = [stack.inspect(c)["State"] for c in ids]
    if len(states) != 1 or states[0]["Running"] or states[0]["ExitCode"] != 0:
        raise CheckFailed(f"migrate did not exit 0: {states}")
    log("migrate: ran once and exited 0")


def submit(url: str, job: dict[str, Any]) -> str:
    status, body = http("POST", f"{url}/jobs", job)
    if status != 201 and status != 200:
        raise CheckFailed(f"POST {url}/jobs answered {status}: {body}")
    return str(body["id"])


def job(url: str, job_id: str) -> dict[str, Any]:
    status, body = http("GET", f"{url}/jobs/{job_id}")
    if status != 200:
        raise CheckFailed(f"GET {url}/jobs/{job_id} answered {status}: {body}")
    result: dict[str, Any] = body
    return result


def wait_all(urls: list[str], ids: list[str], state: str, timeout_s: float) -> None:
    def done() -> bool:
        states = [job(urls[i % len(urls)], j)["state"] for i, j in enumerate(ids)]
        if state == "succeeded" and any(s in {"dead", "cancelled", "failed"} for s in states):
            raise CheckFailed(f"a job ended {states}")
        return all(s == state for s in states)

    wait_for(f"{len(ids)} jobs {state}", done, timeout_s)


def check_jobs(urls: list[str]) -> None:
    for url in urls:
        wait_for(f"{url}/ready", lambda u=url: http("GET", f"{u}/ready")[0] == 200, 60)
    log(f"api: /ready 200 on {len(urls)} replicas ({', '.join(urls)})")
    ids = [submit(urls[i % len(urls)], {"type": "noop", "payload": {"i": i}}) for i in range(20)]
    started = time.monotonic()
    wait_all(urls, ids, "succeeded", 60)
    log(
        f"jobs: 20 noop jobs through {len(urls)} replicas succeeded in "
        f"{time.monotonic() - started:.1f} s"
    )


def check_rescue(stack: Stack, urls: list[str], sleep_ms: int, lease_ttl_s: float) -> None:
    url = urls[0]
    ids = [submit(url, {"type": "sleep", "payload": {"ms": sleep_ms}}) for _ in range(8)]

    def all_running() -> list[dict[str, Any]] | None:
        jobs = [job(url, j) for j in ids]
        return jobs if all(j["state"] == "running" for j in jobs) else None

    running = wait_for("8 sleep jobs running", all_running, 30)
    by_host: dict[str, list[str]] = {}
    for j in running:
        by_host.setdefault(j["lease"]["worker"].split(":")[0], []).append(j["id"])
    containers = {stack.inspect(c)["Config"]["Hostname"]: c for c in stack.containers("worker")}
    if not set(by_host) <= set(containers):
        raise CheckFailed(f"leases held by unknown hosts {set(by_host)} (workers {containers})")
    victim_host = max(by_host, key=lambda h: len(by_host[h]))
    victim = containers[victim_host]
    held = by_host[victim_host]
    subprocess.run(["docker", "kill", victim], check=True, capture_output=True)  # SIGKILL
    killed_at = time.monotonic()
    state = stack.inspect(victim)["State"]
    if state["Running"]:
        raise CheckFailed(f"worker container {victim_host} still running after docker kill")
    log(
        f"rescue: killed worker container {victim_host} (SIGKILL, exit {state['ExitCode']}) "
        f"holding {len(held)} of 8 running sleep jobs ({sleep_ms} ms each)"
    )

    # A rescue waits for the lease to lapse, then the job runs again from the start.
    wait_all([url], ids, "succeeded", lease_ttl_s + sleep_ms / 1000 + 60)
    log(f"rescue: all 8 succeeded {time.monotonic() - killed_at:.1f} s after the kill")
    survivors = set(containers) - {victim_host}
    for job_id in held:
        status, attempts = http("GET", f"{url}/jobs/{job_id}/attempts")
        if status != 200:
            raise CheckFailed(f"GET /jobs/{job_id}/attempts answered {status}: {attempts}")
        rows = attempts["attempts"]
        hosts = [(a["worker"].split(":")[0], a["outcome"]) for a in rows]
        first_host, first_outcome = hosts[0]
        last_host, last_outcome = hosts[-1]
        if first_host != victim_host or first_outcome == "succeeded":
            raise CheckFailed(f"job {job_id}: first attempt not the killed one: {hosts}")
        if last_host not in survivors or last_outcome != "succeeded":
            raise CheckFailed(f"job {job_id}: not finished by another worker: {hosts}")
    for job_id in set(ids) - set(held):  # the survivor's own: ran once, where they were
        _status, attempts = http("GET", f"{url}/jobs/{job_id}/attempts")
        if len(attempts["attempts"]) != 1:
            raise CheckFailed(f"job {job_id} (not on the killed worker) ran again: {attempts}")
    state = stack.inspect(victim)["State"]
    if state["Running"] or state["Restarting"]:
        raise CheckFailed(f"the killed worker container came back: {state}")
    outcome = hosts[0][1]
    log(
        f"rescue: each of the {len(held)} held jobs: attempt 1 on {victim_host} "
        f"(outcome {outcome!r}), succeeded on {', '.join(sorted(survivors))}"
    )


def check_prometheus(stack: Stack, expected: int) -> None:
    (container,) = stack.containers("prometheus")
    port = stack.run("port", "prometheus", "9090").strip()

    def targets() -> list[dict[str, Any]] | None:
        _status, body = http("GET", f"http://{port}/api/v1/targets")
        active: list[dict[str, Any]] = body["data"]["activeTargets"]
        up = [t for t in active if t["health"] == "up"]
        return active if len(up) == expected and len(active) == expected else None

    active = wait_for(f"{expected} Prometheus targets up", targets, 90)
    jobs: dict[str, int] = {}
    for t in active:
        jobs[t["labels"]["job"]] = jobs.get(t["labels"]["job"], 0) + 1
    log(f"prometheus ({container[:12]}): all {expected} targets up: {jobs}")


def check_pgbouncer(stack: Stack, user: str, password: str, db: str) -> None:
    dsn = f"postgresql://{user}:{password}@pgbouncer:6432/{db}"

    def answer() -> str | None:
        out = subprocess.run(
            [*stack.compose, "exec", "-T", "postgres", "psql", dsn, "-Atc", "SELECT 40 + 2"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() == "42" else None

    wait_for("a query through pgbouncer", answer, 60)
    mode = subprocess.run(
        [
            *stack.compose,
            "exec",
            "-T",
            "postgres",
            "psql",
            f"postgresql://{user}:{password}@pgbouncer:6432/pgbouncer",
            "-Atc",
            "SHOW CONFIG",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    pool_mode = [line for line in mode.splitlines() if line.startswith("pool_mode|")]
    if not pool_mode or pool_mode[0].split("|")[1] != "transaction":
        raise CheckFailed(f"pgbouncer pool_mode is not transaction: {pool_mode}")
    log("pgbouncer: SELECT through it answered 42; pool_mode = transaction")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--compose", required=True, help="the compose command, space-separated")
    p.add_argument("--api-replicas", type=int, default=2)
    p.add_argument("--worker-replicas", type=int, default=2)
    p.add_argument("--worker-processes", type=int, default=2)
    p.add_argument("--sleep-ms", type=int, default=6000)
    p.add_argument("--lease-ttl-s", type=float, required=True)
    p.add_argument("--pg-user", required=True)
    p.add_argument("--pg-password", required=True)
    p.add_argument("--pg-db", required=True)
    args = p.parse_args()
    stack = Stack(args.compose.split())
    try:
        check_services(stack, args.api_replicas, args.worker_replicas)
        urls = stack.api_urls(args.api_replicas)
        check_jobs(urls)
        check_prometheus(stack, args.api_replicas + args.worker_replicas * args.worker_processes)
        check_pgbouncer(stack, args.pg_user, args.pg_password, args.pg_db)
        check_rescue(stack, urls, args.sleep_ms, args.lease_ttl_s)
    except CheckFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
