#!/usr/bin/env bash
# make test-compose: deploy/docker-compose.yml, for real, on a machine that reaches no
# image registry (only plain HTTP to Debian's archive).
#
#  1. installs docker.io, docker-compose and debootstrap if missing (root + apt-get);
#  2. starts dockerd if it is not running (and stops it at the end);
#  3. builds a base image with debootstrap (cached: a second run reuses it), and on it
#     images with Debian's Python, PostgreSQL and Prometheus standing in for
#     python:3.12-slim, postgres:16 and prom/prometheus; PgBouncer's image is built
#     FROM the base too;
#  4. builds a wheelhouse of Deadman with the host's venv (pip wheel), which
#     deploy/Dockerfile installs with --no-index;
#  5. brings up the compose file (all profiles) with those images, and runs
#     deploy/compose_check.py (jobs through the API, a worker killed and its jobs
#     rescued, Prometheus targets, PgBouncer);
#  6. tears everything down: containers, network, volumes.
#
# Bounded: every wait has a deadline, and make runs this under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

HOST_PYTHON=${HOST_PYTHON:-.venv/bin/python}
BASE_IMAGE=${DEADMAN_LOCAL_BASE:-deadman-local/bookworm-minbase:latest}
LOCAL=deadman-local
PROJECT=${DEADMAN_COMPOSE_PROJECT:-deadman-compose-test}
STATE=$(mktemp -d /tmp/deadman-compose.XXXXXX)
STARTED_DOCKERD=""
COMPOSE=(docker-compose -p "$PROJECT" -f deploy/docker-compose.yml
         --profile metrics --profile pgbouncer)

log() { printf '[test-compose %4ds] %s\n' "$SECONDS" "$*"; }
fail() { log "FAIL: $*" >&2; exit 1; }

# wait_until SECONDS WHAT COMMAND...: poll COMMAND until it succeeds, or fail.
wait_until() {
    local limit=$1 what=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${limit} s: $what"
        sleep 0.2
    done
}

# The mirror the host's apt uses (deb822 or one-line sources), else Debian's own.
debian_mirror() {
    local uri
    uri=$(grep -hsE '^(URIs:|deb) ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            /etc/apt/sources.list.d/*.sources \
          | grep -oE 'http://[^ ]+/debian/?( |$)' | head -n 1 | tr -d ' ') || true
    echo "${DEADMAN_DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

cleanup() {
    local code=$?
    trap - EXIT INT TERM
    if docker info >/dev/null 2>&1; then
        log "teardown: containers, network and volumes of $PROJECT"
        # One service at a time, clients first, so a slow stop (SIGKILL after the
        # grace) shows up with its service's name.
        local service started
        for service in api worker prometheus pgbouncer postgres; do
            started=$SECONDS
            "${COMPOSE[@]}" stop --timeout 20 "$service" >>"$STATE/down.log" 2>&1 || true
            log "  $service stopped in $((SECONDS - started)) s"
        done
        "${COMPOSE[@]}" down --volumes --remove-orphans --timeout 20 >"$STATE/down.log" 2>&1 \
            || { log "compose down failed:"; cat "$STATE/down.log" >&2; code=1; }
        local left
        left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")
        left+=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
        left+=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT")
        [ -z "$left" ] || { log "left behind: $left" >&2; code=1; }
    fi
    if [ -n "$STARTED_DOCKERD" ]; then
        log "stopping the dockerd this run started (pid $STARTED_DOCKERD)"
        kill -TERM "$STARTED_DOCKERD" 2>/dev/null || true
        local deadline=$((SECONDS + 30))
        while kill -0 "$STARTED_DOCKERD" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        if kill -0 "$STARTED_DOCKERD" 2>/dev/null; then
            log "dockerd did not stop in 30 s; killing it" >&2
            kill -KILL "$STARTED_DOCKERD" 2>/dev/null || true
        fi
    fi
    rm -rf "$STATE"
    exit "$code"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

# 1. the tools
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
        || fail "missing ${missing[*]} and cannot apt-get them (not root?)"
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive nice -n 10 apt-get install -y -qq \
        $(printf '%s\n' "${missing[@]}" | sort -u) >"$STATE/apt.log"
fi
[ -x "$HOST_PYTHON" ] || fail "no host Python at $HOST_PYTHON (make install, or set HOST_PYTHON)"

# 2. the engine
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || fail "dockerd is not running and only root can start it"
    log "starting dockerd (overlay2)"
    dockerd --storage-driver=overlay2 >"$STATE/dockerd.log" 2>&1 &
    STARTED_DOCKERD=$!
    wait_until 60 "dockerd answering" docker info
fi

# 3. the images
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    mirror=$(debian_mirror)
    log "building the base image $BASE_IMAGE (debootstrap minbase bookworm from $mirror)"
    nice -n 10 debootstrap --variant=minbase bookworm "$STATE/rootfs" "$mirror" \
        >"$STATE/debootstrap.log" 2>&1 || { tail -n 20 "$STATE/debootstrap.log" >&2; fail debootstrap; }
    # As Debian's official images do: no service starts while a package installs.
    printf '#!/bin/sh\nexit 101\n' >"$STATE/rootfs/usr/sbin/policy-rc.d"
    chmod +x "$STATE/rootfs/usr/sbin/policy-rc.d"
    rm -rf "$STATE"/rootfs/var/cache/apt/archives/*.deb "$STATE"/rootfs/var/lib/apt/lists/*
    tar -C "$STATE/rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
    rm -rf "$STATE/rootfs"
else
    log "base image $BASE_IMAGE: cached"
fi
for name in python postgres prometheus; do
    log "image $LOCAL/$name (FROM $BASE_IMAGE)"
    nice -n 10 docker build -q -t "$LOCAL/$name:latest" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -f "deploy/local/$name.Dockerfile" deploy/local >/dev/null
done

# 4. the wheelhouse
log "wheelhouse: pip wheel . with $HOST_PYTHON"
rm -rf deploy/.wheelhouse
nice -n 10 "$HOST_PYTHON" -m pip wheel --disable-pip-version-check -q . -w deploy/.wheelhouse \
    >"$STATE/wheel.log" 2>&1 || { cat "$STATE/wheel.log" >&2; fail "pip wheel"; }

# 5. the stack: the compose file as a user runs it, only the base images overridden
export PYTHON_IMAGE=$LOCAL/python:latest POSTGRES_IMAGE=$LOCAL/postgres:latest
export DEBIAN_IMAGE=$BASE_IMAGE PROMETHEUS_IMAGE=$LOCAL/prometheus:latest
export DEADMAN_IMAGE=deadman-compose-test:latest PGBOUNCER_IMAGE=deadman-compose-test-pgbouncer:latest
export DEADMAN_WHEELHOUSE=deploy/.wheelhouse
export POSTGRES_USER=deadman POSTGRES_DB=deadman
POSTGRES_PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export POSTGRES_PASSWORD
export API_REPLICAS=2 WORKER_REPLICAS=2 WORKER_PROCESSES=2
PROMETHEUS_PORT=$("$HOST_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PROMETHEUS_PORT  # a free one, not 9090: this machine may run a Prometheus
# Short leases so a rescue takes seconds (heartbeat at most half the lease).
export DEADMAN_LEASE_TTL_S=4 DEADMAN_HEARTBEAT_S=1 DEADMAN_RESCUE_S=1 DEADMAN_POLL_S=0.5

log "compose build"
nice -n 10 "${COMPOSE[@]}" build -q >"$STATE/build.log" 2>&1 \
    || { tail -n 40 "$STATE/build.log" >&2; fail "compose build"; }
log "compose up"
"${COMPOSE[@]}" up -d >"$STATE/up.log" 2>&1 || { cat "$STATE/up.log" >&2; fail "compose up"; }

# 6. the checks
if ! "$HOST_PYTHON" deploy/compose_check.py --compose "${COMPOSE[*]}" \
        --api-replicas "$API_REPLICAS" --worker-replicas "$WORKER_REPLICAS" \
        --worker-processes "$WORKER_PROCESSES" --lease-ttl-s "$DEADMAN_LEASE_TTL_S" \
        --pg-user "$POSTGRES_USER" --pg-password "$POSTGRES_PASSWORD" --pg-db "$POSTGRES_DB"; then
    log "logs of the stack (last 30 lines per container):"
    "${COMPOSE[@]}" logs --no-color --tail 30 >&2 || true
    fail "compose checks"
fi
log "PASS"
