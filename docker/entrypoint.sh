#!/bin/sh
# rl-platform container entrypoint (PID 1 is tini, which runs this; it execs the command).
#  * HOME must be writable (Ray, matplotlib, torch and hydra write caches there). On a read-only root filesystem
#    /home/ray is not, so HOME moves to /tmp/home (mount a tmpfs/emptyDir on /tmp). Set HOME yourself to pick
#    another writable place.
#  * Marks serving containers for the HEALTHCHECK (docker/healthcheck.py): a container whose command is
#    `rlp-serve`, `python -m serving` or `serve ...` is probed on /healthz; a trainer has no HTTP endpoint
#    and reports healthy.
set -eu

if ! { [ -d "${HOME:-/nonexistent}" ] && [ -w "${HOME}" ]; }; then
  export HOME=/tmp/home
fi
mkdir -p "${HOME}" 2>/dev/null || true

role=other
case "$(basename "${1:-}")" in
  rlp-serve | serve) role=serve ;;
  python | python3 | python3.11) [ "${2:-}" = -m ] && [ "${3:-}" = serving ] && role=serve ;;
esac
echo "${role}" >/tmp/.rlp-role 2>/dev/null || true

exec "$@"
