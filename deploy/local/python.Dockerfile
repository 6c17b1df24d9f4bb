# Stands in for python:3.12-slim where no registry is reachable (make test-compose):
# Debian's Python 3.11 on a base image built locally with debootstrap. Plain HTTP to
# Debian's archive is all it needs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
