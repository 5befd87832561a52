# /etc/profile.d/rl-platform.sh: login shells (`bash -l`, what KubeRay's pod command runs) get the same
# environment as the image's entrypoint: Debian's /etc/profile resets PATH, which would hide /opt/venv/bin
# (`ray`, `python`, `serve`), and HOME must be writable on a read-only root filesystem.
case ":${PATH}:" in
  *:/opt/venv/bin:*) ;;
  *) PATH="/opt/venv/bin:${PATH}" ;;
esac
export PATH VIRTUAL_ENV=/opt/venv
if ! { [ -d "${HOME:-/nonexistent}" ] && [ -w "${HOME}" ]; }; then
  HOME=/tmp/home
  export HOME
  mkdir -p "${HOME}" 2>/dev/null || true
fi
