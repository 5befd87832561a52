#!/usr/bin/env python3
"""Make a one-layer container image tarball from a folder, without Docker or a registry (stdlib only).

    oci-image.py --rootfs DIR --entrypoint /pause --user 65535:65535 --tag NAME:TAG --out FILE.tar

The tarball is in the `docker save` layout (manifest.json with RepoTags, the image config JSON, one uncompressed
layer tar), which `ctr -n k8s.io images import FILE.tar` and `docker load -i FILE.tar` both accept. It also carries
the legacy `repositories` file for old loaders.

Reproducible: entries are sorted, owned by 0:0 with mtime 0 and normalized modes, and the config has a fixed
creation date, so the same rootfs always gives the same layer digest and image ID (containerd's image ID is the
config digest; hack/cluster/node.sh relies on that to skip re-imports).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import stat
import sys
import tarfile
import tempfile

EPOCH = "1970-01-01T00:00:00Z"
GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
          "s390x": "s390x", "riscv64": "riscv64"}


def add_tree(tar: tarfile.TarFile, root: str) -> None:
    """Add every entry under root, sorted, as a path relative to the image's /, with normalized metadata."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            entries.append(os.path.join(dirpath, name))
    for path in sorted(entries, key=lambda p: os.path.relpath(p, root)):
        rel = os.path.relpath(path, root)
        info = tar.gettarinfo(path, arcname=rel)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            info.mode = 0o755
        elif stat.S_ISREG(st.st_mode):
            info.mode = 0o755 if st.st_mode & 0o111 else 0o644
        if info.isreg():
            with open(path, "rb") as f:
                tar.addfile(info, f)
        elif info.isdir() or info.issym() or info.islnk():
            tar.addfile(info)
        else:
            raise SystemExit(f"oci-image.py: unsupported file type in rootfs: {path}")


def layer_bytes(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_tree(tar, rootfs)
    return buf.getvalue()


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = 0
    tar.addfile(info)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rootfs", required=True, help="folder whose content becomes the image's /")
    p.add_argument("--entrypoint", required=True, help="absolute path of the program to run, e.g. /pause")
    p.add_argument("--cmd", action="append", default=[], help="default argument (repeatable)")
    p.add_argument("--user", default="", help="user[:group] the entrypoint runs as, e.g. 65535:65535")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable)")
    p.add_argument("--tag", required=True, help="repository:tag, e.g. registry.k8s.io/pause:3.10")
    p.add_argument("--out", required=True, help="tarball to write")
    p.add_argument("--arch", default=GOARCH.get(platform.machine(), platform.machine()))
    a = p.parse_args(argv)

    if not os.path.isdir(a.rootfs):
        p.error(f"--rootfs {a.rootfs}: not a folder")
    if not a.entrypoint.startswith("/"):
        p.error("--entrypoint must be an absolute path inside the image")
    ep = os.path.join(a.rootfs, a.entrypoint.lstrip("/"))
    if not (os.path.isfile(ep) and os.access(ep, os.X_OK)):
        p.error(f"--entrypoint {a.entrypoint}: no executable file {ep}")
    name, _, tag = a.tag.rpartition(":")
    if not name or "/" in tag:
        p.error(f"--tag {a.tag}: expected repository:tag")
    for e in a.env:
        if "=" not in e:
            p.error(f"--env {e}: expected KEY=VALUE")

    layer = layer_bytes(a.rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    cfg: dict = {
        "Entrypoint": [a.entrypoint],
        "Env": a.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
    }
    if a.cmd:
        cfg["Cmd"] = a.cmd
    if a.user:
        cfg["User"] = a.user
    config = {
        "architecture": a.arch,
        "os": "linux",
        "created": EPOCH,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": EPOCH, "created_by": "hack/cluster/oci-image.py " + os.path.basename(a.rootfs)}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_hex = hashlib.sha256(config_bytes).hexdigest()
    layer_dir = diff_id.split(":", 1)[1]
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": [a.tag], "Layers": [f"{layer_dir}/layer.tar"]}]
    repositories = {name: {tag: layer_dir}}

    out_dir = os.path.dirname(os.path.abspath(a.out))
    fd, tmp = tempfile.mkstemp(prefix=".oci-image.", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            add_dir(tar, f"{layer_dir}/")
            add_bytes(tar, f"{layer_dir}/VERSION", b"1.0")
            add_bytes(tar, f"{layer_dir}/layer.tar", layer)
            add_bytes(tar, f"{config_hex}.json", config_bytes)
            add_bytes(tar, "manifest.json", json.dumps(manifest, separators=(",", ":")).encode())
            add_bytes(tar, "repositories", json.dumps(repositories, separators=(",", ":")).encode())
        os.chmod(tmp, 0o644)
        os.replace(tmp, a.out)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"{a.tag} sha256:{config_hex} ({len(layer)} byte layer) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
