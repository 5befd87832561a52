#!/bin/sh
# Start redis-server for Ray's GCS state (docker/redis.Dockerfile). The configuration goes to redis-server on stdin
# (`redis-server -`), so the password (REDIS_PASSWORD, from a Kubernetes Secret) is on no command line and in no
# file. Data: append-only file (fsync every second) + RDB snapshots in REDIS_DATA_DIR, the PersistentVolumeClaim.
# Extra arguments are passed on to redis-server (e.g. --maxmemory 256mb).
set -eu
: "${REDIS_PORT:=6379}"
: "${REDIS_DATA_DIR:=/data}"
if [ -z "${REDIS_PASSWORD:-}" ]; then
  echo "rlp-redis: REDIS_PASSWORD is empty: refusing to start a Redis without a password (set it from a Secret)" >&2
  exit 2
fi
case "${REDIS_PASSWORD}" in
  *[!A-Za-z0-9._~+/=-]*)
    echo "rlp-redis: REDIS_PASSWORD may hold only letters, digits and ._~+/=- (it goes into redis.conf syntax)" >&2
    exit 2 ;;
esac
mkdir -p "${REDIS_DATA_DIR}" || { echo "rlp-redis: cannot create ${REDIS_DATA_DIR} as uid $(id -u)" >&2; exit 2; }
[ -w "${REDIS_DATA_DIR}" ] || { echo "rlp-redis: ${REDIS_DATA_DIR} is not writable by uid $(id -u)" >&2; exit 2; }
exec redis-server - "$@" <<CONF
port ${REDIS_PORT}
bind * -::*
protected-mode yes
requirepass ${REDIS_PASSWORD}
dir ${REDIS_DATA_DIR}
appendonly yes
appendfsync everysec
save 300 1
daemonize no
logfile ""
CONF
