# rl-platform Redis: the store of Ray's GCS state for GCS fault tolerance (chart value gcsFaultTolerance).
#
# Debian bookworm's redis-server 7.0.x, BSD-3-Clause. Redis 7.4 and later are under RSALv2/SSPLv1 (not open source):
# the build fails unless the installed server is a 7.0 release. Built by `make images` (hack/images.sh build redis)
# FROM the same debootstrapped Debian base as the other images; apt reads the archives that base was made from
# (this machine's apt configuration, docker/host_indexes.py). No registry is named here.
# Runs as any non-root uid (the chart: 1000); the password comes from the environment (REDIS_PASSWORD, a Secret),
# never from a file in the image or a command line (docker/redis-entrypoint.sh).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# tini: PID 1 (SIGTERM reaches redis-server, which then writes its AOF and exits). redis-tools (redis-cli) comes
# with redis-server: the chart's probes use it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log /etc/redis/redis.conf \
 && redis-server --version | grep -Eq ' v=7\.0\.[0-9]+ ' \
 && test -f /usr/share/doc/redis-server/copyright
COPY docker/redis-entrypoint.sh /usr/local/bin/rlp-redis
USER 1000:1000
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/rlp-redis"]
ARG IMAGE_VERSION=unversioned
LABEL org.opencontainers.image.title="rl-platform-redis" \
      org.opencontainers.image.description="Redis 7.0 (Debian bookworm redis-server, BSD-3-Clause) for Ray GCS fault tolerance" \
      org.opencontainers.image.licenses="BSD-3-Clause" \
      org.opencontainers.image.version="${IMAGE_VERSION}" \
      ai.rl-platform.flavour="redis"
