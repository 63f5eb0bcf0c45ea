# Redis from Debian's package on the local base image, for machines that cannot pull redis:7-alpine
# (docker/smoke.sh builds it; docker/compose.local.yml runs it). Not used by docker-compose.yml.
ARG BASE_IMAGE=local/bookworm-py
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data
WORKDIR /data
CMD ["redis-server"]
