#!/bin/sh
# First start: a cluster in $PGDATA owned by $POSTGRES_USER with $POSTGRES_PASSWORD
# (SCRAM over TCP unless POSTGRES_HOST_AUTH_METHOD says otherwise, like the official
# image), and the database $POSTGRES_DB. Then the server in the foreground, with any
# extra arguments (-c name=value) passed on.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ "${1:-postgres}" = postgres ]; then
    [ $# -gt 0 ] && shift
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        pwfile="$(mktemp)"
        printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
        initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust \
            --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
        rm -f "$pwfile"
        echo "host all all all ${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >> "$PGDATA/pg_hba.conf"
        if [ "$db" != postgres ]; then
            echo "CREATE DATABASE \"$db\"" | postgres --single -D "$PGDATA" -j postgres >/dev/null
        fi
        echo "postgres-entrypoint: initialized $PGDATA (user $user, database $db)"
    fi
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
