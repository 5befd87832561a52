"""Print the building machine's own package indexes as KEY=value lines, for hack/images.sh to pass to a build.

The repo names no index host: pip's indexes come from this machine's pip configuration (PIP_INDEX_URL /
PIP_EXTRA_INDEX_URL, else `pip config`: global, then install), apt's from its apt sources (one-line `*.list` and
deb822 `*.sources`). Keys (empty when this machine does not set them; pip's own default then applies):
  PKG_INDEX_URL, PKG_EXTRA_INDEX_URL   pip --index-url / --extra-index-url
  APT_MIRROR                           first `deb` archive that is not a -security suite
  APT_SECURITY_MIRROR                  first `deb` archive serving a -security suite

    python3 docker/host_indexes.py [--apt-dir /etc/apt] [--pip PYTHON]
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path


def pip_setting(python: str, key: str) -> str:
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"), "").strip()
    if env:
        return env.split()[0] if key == "index-url" else env
    for scope in ("global", "install"):
        try:
            out = subprocess.run([python, "-m", "pip", "config", "get", f"{scope}.{key}"], capture_output=True,
                                 text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        if out.returncode == 0 and out.stdout.strip():
            return " ".join(out.stdout.split())
    return ""


def apt_sources(apt_dir: Path) -> list[tuple[str, list[str]]]:
    """(URI, suites) of every enabled `deb` source, in apt's reading order."""
    files = [apt_dir / "sources.list"] + sorted((apt_dir / "sources.list.d").glob("*"))
    out: list[tuple[str, list[str]]] = []
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".list" or f.name == "sources.list":
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if words[:1] != ["deb"]:
                    continue
                words = words[1:]
                if words and words[0].startswith("["):  # [arch=amd64 signed-by=...] options
                    while words and not words[0].endswith("]"):
                        words.pop(0)
                    words = words[1:]
                if len(words) >= 2:
                    out.append((words[0], [words[1]]))
        elif f.suffix == ".sources":
            for para in text.split("\n\n"):
                fields: dict[str, str] = {}
                for line in para.splitlines():
                    if ":" in line and not line.startswith((" ", "#")):
                        k, v = line.split(":", 1)
                        fields[k.strip().lower()] = v.strip()
                if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                    for uri in fields.get("uris", "").split():
                        out.append((uri, fields.get("suites", "").split()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--apt-dir", default="/etc/apt")
    ap.add_argument("--pip", default="python3", help="the Python whose pip configuration counts")
    args = ap.parse_args()
    sources = apt_sources(Path(args.apt_dir))
    main_uri = next((u for u, s in sources if not any(x.endswith("-security") for x in s)), "")
    sec_uri = next((u for u, s in sources if any(x.endswith("-security") for x in s)), "")
    print(f"PKG_INDEX_URL={pip_setting(args.pip, 'index-url')}")
    print(f"PKG_EXTRA_INDEX_URL={pip_setting(args.pip, 'extra-index-url')}")
    print(f"APT_MIRROR={main_uri.rstrip('/')}")
    print(f"APT_SECURITY_MIRROR={sec_uri.rstrip('/')}")


if __name__ == "__main__":
    main()
