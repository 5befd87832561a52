"""Image builds take package indexes from the building machine, never from the repo (checked without Docker)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_FILES = [REPO / "Dockerfile.cpu", REPO / "Dockerfile.gpu", REPO / "docker" / "pipcheck.Dockerfile",
               REPO / "hack" / "images.sh", REPO / "docker" / "README.md"]
# Hosts made up for the test (.invalid never resolves).
MIRROR, SECURITY, INDEX, EXTRA = ("http://apt.invalid/debian", "http://apt.invalid/debian-security",
                                  "https://pip.invalid/simple", "https://extra.invalid/simple")


def host_indexes(apt_dir: Path, **env: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | env
    out = subprocess.run([sys.executable, str(REPO / "docker" / "host_indexes.py"), "--apt-dir", str(apt_dir),
                          "--pip", sys.executable], env=e, check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_apt_sources_deb822_and_one_line(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("# comment\ndeb-src http://src.invalid/debian bookworm main\n")
    (tmp_path / "sources.list.d" / "a-off.sources").write_text(
        f"Types: deb\nURIs: http://off.invalid/debian\nSuites: bookworm\nEnabled: no\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        f"Types: deb\nURIs: {MIRROR}/\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        f"Types: deb\nURIs: {SECURITY}\nSuites: bookworm-security\nComponents: main\n")
    got = host_indexes(tmp_path, PIP_INDEX_URL=INDEX, PIP_EXTRA_INDEX_URL=EXTRA)
    assert got == {"PKG_INDEX_URL": INDEX, "PKG_EXTRA_INDEX_URL": EXTRA, "APT_MIRROR": MIRROR,
                   "APT_SECURITY_MIRROR": SECURITY}
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(f"deb [arch=amd64 signed-by=/k.gpg] {MIRROR} bookworm main\n"
                                           f"deb {SECURITY} bookworm-security main\n")
    got = host_indexes(tmp_path)
    assert (got["APT_MIRROR"], got["APT_SECURITY_MIRROR"]) == (MIRROR, SECURITY)


def test_images_sh_passes_this_machines_pip_index_as_build_args(tmp_path):
    # images.sh without its last line (`main "$@"`) is a library of its functions. It sources
    # hack/cluster/common.sh relative to itself, so the copy sits in a hack/ beside a link to the real one.
    (tmp_path / "hack").mkdir()
    (tmp_path / "hack" / "cluster").symlink_to(REPO / "hack" / "cluster")
    lib = tmp_path / "hack" / "images-lib.sh"
    text = (REPO / "hack" / "images.sh").read_text()
    assert text.rstrip().endswith('main "$@"')
    lib.write_text(text.rstrip()[: -len('main "$@"')])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    script = f'source "{lib}"; ROOT="{REPO}"; pip_index_args'
    out = subprocess.run(["bash", "-c", script], env=env | {"PIP_INDEX_URL": INDEX, "PIP_EXTRA_INDEX_URL": EXTRA},
                         cwd=REPO, check=True, capture_output=True, text=True).stdout.splitlines()
    assert out == ["--build-arg", f"PKG_INDEX_URL={INDEX}", "--build-arg", f"PKG_EXTRA_INDEX_URL={EXTRA}"]


def test_no_index_host_is_written_in_the_build_files():
    for f in BUILD_FILES:
        for url in re.findall(r"\b[a-z][a-z0-9+.-]*://[^\s\"'`)]*", f.read_text()):
            assert url.split("://", 1)[1].startswith(("127.0.0.1", "${", "$")), f"{f.name}: {url}"


def test_every_pip_that_can_reach_an_index_uses_the_machines_index():
    for name in ("Dockerfile.cpu", "Dockerfile.gpu", "docker/pipcheck.Dockerfile"):
        text = (REPO / name).read_text().replace("\\\n", " ")
        cmds = re.findall(r"pip (?:install|wheel|download)\b[^;&|]*", text)
        assert cmds, name
        for cmd in cmds:
            offline = "--no-index" in cmd or "/tmp/dist/" in cmd
            torch_only = '--index-url "${TORCH_INDEX_URL}"' in cmd and "--no-deps" in cmd
            assert offline or torch_only or '${PKG_INDEX_URL:+--index-url "${PKG_INDEX_URL}"}' in cmd, f"{name}: {cmd}"
