# Stands in for prom/prometheus where no registry is reachable (make test-compose):
# Debian's Prometheus, run the way deploy/docker-compose.yml runs the official image.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
EXPOSE 9090
ENTRYPOINT ["prometheus", "--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
