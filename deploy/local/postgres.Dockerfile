# Stands in for postgres:16 where no registry is reachable (make test-compose, and
# DEADMAN_TEST_BACKEND=testcontainers here): Debian's PostgreSQL 15, with the part of
# the official image's interface that deploy/docker-compose.yml and testcontainers
# use: POSTGRES_USER/POSTGRES_PASSWORD/POSTGRES_DB/POSTGRES_HOST_AUTH_METHOD, PGDATA,
# port 5432, pg_isready, psql.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# No cluster at install time: the entrypoint creates one in PGDATA on first start.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/none.conf \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
CMD ["postgres"]
