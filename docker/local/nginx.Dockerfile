# nginx (and wget, for the lb's healthcheck) from Debian's packages on the local base image, for
# machines that cannot pull nginx:1.30-alpine (docker/smoke.sh builds it; docker/compose.local.yml
# runs it). Debian 12's nginx is 1.22, without `resolve`: the smoke's config has none.
ARG BASE_IMAGE=local/bookworm-py
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx wget \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/*
CMD ["nginx", "-g", "daemon off;"]
