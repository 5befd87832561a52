#!/usr/bin/env bash
# Build what the later test suites need while the earlier ones run (`make test`, mk/k8s.mk TEST_BACKGROUND).
#
#   hack/background.sh start 'CMD ...' ['CMD ...' ...]   run the command lines one after another, detached, at the
#                                                         lowest CPU and I/O priority; returns at once
#   hack/background.sh boost                              raise that run to normal priority (someone waits for it),
#                                                         saying where its log is; nothing with RLP_NO_BOOST=1
#   hack/background.sh low CMD [ARG...]                   run CMD at that lowest priority, RLP_NO_BOOST=1: it waits
#                                                         for the background run without raising it, or builds niced
#
# Each command is a script that owns a lock for what it builds (hack/tools.sh per phase, hack/images.sh per
# machine): whoever needs a product later calls the same script, which waits on that lock (calling `boost`) and
# then finds the product built, or builds it itself when the background run failed. The background run's own steps
# never boost it (RLP_NO_BOOST=1), nor does a caller that is in no hurry (`low`: the cluster tier waiting for its
# binaries beside the Python suites, which a boost would slow). Log and process group:
# ${RLP_CACHE}/logs/background.{log,pgid}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG_DIR="${RLP_CACHE:-${HOME}/.cache/rl-platform}/logs"
LOG="${LOG_DIR}/background.log"
PGID_FILE="${LOG_DIR}/background.pgid"

log() { printf '[background] %s\n' "$*" >&2; }

LOW=(nice -n 19)  # the lowest CPU and I/O priority
command -v ionice >/dev/null 2>&1 && LOW+=(ionice -c 3)

running_pgid() { # the process group of a background run still alive, else nothing
  local pgid; pgid="$(cat "${PGID_FILE}" 2>/dev/null || true)"
  [[ "${pgid}" =~ ^[0-9]+$ ]] && kill -0 -- "-${pgid}" 2>/dev/null && printf '%s' "${pgid}"
  return 0
}

start() {
  (($#)) || { echo "usage: $0 start 'CMD ...' ..." >&2; exit 2; }
  mkdir -p "${LOG_DIR}"
  local pgid; pgid="$(running_pgid)"
  [[ -z "${pgid}" ]] || { log "a background build is still running (process group ${pgid}, ${LOG}): not starting another"; return 0; }
  local script="" c
  for c in "$@"; do  # one after another; a failed step is logged and the next still runs
    script+="echo \"[background] \$(date -u +%T) start: ${c//\"/\\\"}\"; ( ${c} ) || echo \"[background] FAILED (exit \$?): ${c//\"/\\\"}\"; "
  done
  script+='echo "[background] $(date -u +%T) done"'
  # Its own session and process group (setsid), recorded so that a waiting caller can raise its priority.
  cd "${ROOT}"
  RLP_NO_BOOST=1 setsid "${LOW[@]}" bash -c "${script}" > "${LOG}" 2>&1 < /dev/null &
  echo "$!" > "${PGID_FILE}"
  log "building in the background (process group $!, log ${LOG}):$(printf " [%s]" "$@")"
}

boost() {
  local pgid p; pgid="$(running_pgid)"
  [[ -n "${pgid}" && "${RLP_NO_BOOST:-0}" != 1 ]] || return 0
  log "make test's background build (log ${LOG}) runs at normal priority from now on"
  renice -n 0 -g "${pgid}" >/dev/null 2>&1 || true  # root only: elsewhere it stays nice
  if command -v ionice >/dev/null 2>&1; then
    for p in $(pgrep -g "${pgid}" 2>/dev/null || true); do ionice -c 2 -n 4 -p "${p}" 2>/dev/null || true; done
  fi
  return 0
}

case "${1:-}" in
  start) shift; start "$@" ;;
  boost) boost ;;
  low) shift; (($#)) || { echo "usage: $0 low CMD [ARG...]" >&2; exit 2; }; RLP_NO_BOOST=1 exec "${LOW[@]}" "$@" ;;
  *) echo "usage: $0 start 'CMD ...' ... | boost | low CMD [ARG...]" >&2; exit 2 ;;
esac
