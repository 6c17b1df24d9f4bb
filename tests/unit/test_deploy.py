"""deploy/: the compose file, the Dockerfile and the Prometheus config say what issue 17
asks of them (`make test-compose` runs them for real; this is the fast check that they
parse and still name everything), and DEADMAN_TEST_BACKEND takes hostile input."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deadman.api.routes_ops import ROUTES
from deadman.config import Settings
from tests.helpers import pg_backend

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
yaml: Any = importlib.import_module("yaml")  # PyYAML, a dev dependency via schemathesis


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return loaded


def test_compose_names_every_service_the_issue_asks_for() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker", "pgbouncer", "prometheus"}
    assert services["postgres"]["image"] == "${POSTGRES_IMAGE:-postgres:16}"
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert services["migrate"]["command"] == ["deadman", "migrate"]
    assert services["migrate"]["restart"] == "no"
    assert services["api"]["scale"] == "${API_REPLICAS:-2}"
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    assert "deadman worker --processes" in " ".join(services["worker"]["command"])
    assert services["pgbouncer"]["profiles"] == ["pgbouncer"]
    assert services["pgbouncer"]["environment"]["PGBOUNCER_POOL_MODE"] == (
        "${PGBOUNCER_POOL_MODE:-transaction}"
    )
    assert services["prometheus"]["profiles"] == ["metrics"]
    build = services["api"]["build"]
    assert build["args"]["PYTHON_IMAGE"] == "${PYTHON_IMAGE:-python:3.12-slim}"


def test_compose_passes_every_deadman_setting_from_the_environment() -> None:
    env = _compose()["x-deadman-env"]
    for f in dataclasses.fields(Settings):
        var = "DEADMAN_" + f.name.upper()
        assert var in env, f"{var} is not passed to the API and workers"
        if var != "DEADMAN_DATABASE_URL":
            assert str(env[var]).startswith(f"${{{var}:-"), f"{var} is baked in: {env[var]}"
    for var in ("DEADMAN_LISTEN_URL", "DEADMAN_LISTEN"):  # for the pgbouncer profile
        assert env[var] == f"${{{var}:-}}"
    # no password anywhere but from the environment
    text = (DEPLOY / "docker-compose.yml").read_text()
    assert re.findall(r"POSTGRES_PASSWORD: (.+)", text) == [
        "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (deploy/env.example)}"
    ]


def test_dockerfile_is_multi_stage_non_root_and_checks_health() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    assert "ARG PYTHON_IMAGE=python:3.12-slim" in lines
    assert [line for line in lines if line.startswith("FROM ")] == [
        "FROM ${PYTHON_IMAGE} AS build",
        "FROM ${PYTHON_IMAGE}",
    ]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    health = next(i for i, line in enumerate(lines) if line.startswith("HEALTHCHECK "))
    assert "/health" in lines[health + 1]
    # the route the check asks for is the API's liveness route, open without a token
    assert any(getattr(r, "path", None) == "/health" for r in ROUTES)


def test_prometheus_scrapes_the_api_and_every_worker_process() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert [(d["names"], d["port"]) for d in jobs["deadman-api"]["dns_sd_configs"]] == [
        (["api"], 8080)
    ]
    worker_ports = [d["port"] for d in jobs["deadman-worker"]["dns_sd_configs"]]
    default = _compose()["services"]["worker"]["environment"]["WORKER_PROCESSES"]
    match = re.fullmatch(r"\$\{WORKER_PROCESSES:-([0-9]+)\}", default)
    assert match is not None, default
    processes = int(match.group(1))
    assert worker_ports == [9100 + i for i in range(processes)]  # fleet child i: 9100 + i


@pytest.mark.parametrize("raw", ["", "  ", "local", "testcontainers"])
def test_backend_takes_the_known_names(raw: str) -> None:
    assert pg_backend.backend({pg_backend.BACKEND_ENV: raw}) == (raw.strip() or "local")
    assert pg_backend.backend({}) == "local"


@pytest.mark.parametrize(
    "raw", ["bogus", "Testcontainers", "local,testcontainers", "docker", "x" * 5000, "local\x00"]
)
def test_backend_refuses_anything_else(raw: str) -> None:
    with pytest.raises(pg_backend.BackendError, match="DEADMAN_TEST_BACKEND"):
        pg_backend.backend({pg_backend.BACKEND_ENV: raw})


@pytest.mark.parametrize("raw", ["post gres:16", "\x1b[31mred", "pöstgres", "a" * 300, "x\ny"])
def test_image_refuses_what_is_no_reference(raw: str) -> None:
    assert pg_backend.image({}) == "postgres:16"
    with pytest.raises(pg_backend.BackendError, match="DEADMAN_TEST_POSTGRES_IMAGE"):
        pg_backend.image({pg_backend.IMAGE_ENV: raw})


def test_a_misspelt_backend_stops_pytest_before_any_test(tmp_path: Path) -> None:
    env = {**os.environ, pg_backend.BACKEND_ENV: "testcontainer"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--collect-only", "tests/unit/test_model.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert "DEADMAN_TEST_BACKEND='testcontainer': must be one of local, testcontainers" in (
        out.stderr
    )
