#!/bin/sh
# Writes pgbouncer.ini and the auth file from the environment, then runs pgbouncer in
# the foreground. Nothing is baked into the image; the password only reaches a 0600
# file in a directory of this process.
set -eu
: "${PGBOUNCER_DB_HOST:?PGBOUNCER_DB_HOST is required (the Postgres server)}"
: "${PGBOUNCER_USER:?PGBOUNCER_USER is required}"
: "${PGBOUNCER_PASSWORD:?PGBOUNCER_PASSWORD is required}"
dir="$(mktemp -d)"
umask 077
printf '"%s" "%s"\n' "$PGBOUNCER_USER" "$PGBOUNCER_PASSWORD" > "$dir/userlist.txt"
cat > "$dir/pgbouncer.ini" <<INI
[databases]
* = host=${PGBOUNCER_DB_HOST} port=${PGBOUNCER_DB_PORT:-5432}

[pgbouncer]
listen_addr = 0.0.0.0
listen_port = ${PGBOUNCER_PORT:-6432}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = ${PGBOUNCER_POOL_MODE:-transaction}
max_client_conn = ${PGBOUNCER_MAX_CLIENT_CONN:-1000}
default_pool_size = ${PGBOUNCER_DEFAULT_POOL_SIZE:-20}
ignore_startup_parameters = extra_float_digits
admin_users = ${PGBOUNCER_USER}
INI
exec pgbouncer "$@" "$dir/pgbouncer.ini"
