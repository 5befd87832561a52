"""Where runs and checkpoints live: a local path or any URI pyarrow understands (s3://, gs://, hdfs://, ...), so
training pods write to shared storage and serving replicas read from it. Small files go through pyarrow's
filesystem; RLlib writes and reads checkpoints with the same filesystem object."""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pyarrow.fs as pafs

from rl_checkpoint.errors import CheckpointError

# URI options that carry secrets: never echoed in logs, summaries or the server's /v1/policies.
_SECRET_OPTIONS = {"access_key", "secret_key", "session_token", "credential_access_token"}


def is_uri(location: str) -> bool:
    return "://" in location


def redact(location: str) -> str:
    """`location` with secret URI options replaced, for messages a user or client sees."""
    if "?" not in location:
        return location
    base, query = location.split("?", 1)
    opts = [(k, "***" if k in _SECRET_OPTIONS else v) for k, v in parse_qsl(query, keep_blank_values=True)]
    return f"{base}?{urlencode(opts, safe=':/*')}"


@dataclass
class Storage:
    location: str  # as the user gave it (absolute for local paths)
    fs: pafs.FileSystem
    root: str  # path inside fs
    query: str = ""  # URI options (e.g. ?endpoint_override=...&scheme=http), kept on derived URIs

    @classmethod
    def open(cls, location: str, create: bool = True, base_dir: str | None = None) -> "Storage":
        """`create`: make a local directory (writers); readers pass False. `base_dir` anchors relative paths."""
        if not is_uri(location):
            location = os.path.abspath(os.path.join(base_dir or os.getcwd(), os.path.expanduser(location)))
            if create:
                os.makedirs(location, exist_ok=True)
            return cls(location, pafs.LocalFileSystem(), location)
        try:
            fs, root = pafs.FileSystem.from_uri(location)
        except Exception as e:  # pyarrow raises ArrowInvalid/OSError variants for bad URIs or credentials
            raise CheckpointError(f"cannot open {redact(location)!r}: {e}") from e
        query = location.split("?", 1)[1] if "?" in location else ""
        return cls(location, fs, root.rstrip("/"), query)

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def uri(self, *parts: str) -> str:
        """A user-facing location for `parts` (a local path, or a URI with the same options)."""
        if self.local:
            return os.path.join(self.location, *parts)
        base = self.location.split("?", 1)[0].rstrip("/")
        uri = "/".join([base, *parts]) if parts else base
        return f"{uri}?{self.query}" if self.query else uri

    def child(self, *parts: str) -> "Storage":
        """The same filesystem, rooted at `parts`."""
        return Storage(self.uri(*parts), self.fs, self.path(*parts), self.query)

    def info(self, *parts: str) -> pafs.FileInfo:
        try:
            return self.fs.get_file_info(self.path(*parts))
        except OSError as e:  # unreachable endpoint, bad credentials, missing bucket
            raise CheckpointError(f"cannot read {redact(self.uri(*parts))!r}: {e}") from e

    def exists(self, *parts: str) -> bool:
        return self.info(*parts).type != pafs.FileType.NotFound

    def is_file(self, *parts: str) -> bool:
        return self.info(*parts).type == pafs.FileType.File

    def is_dir(self, *parts: str) -> bool:
        return self.info(*parts).type == pafs.FileType.Directory

    def mkdir(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def read_bytes(self, *parts: str) -> bytes:
        with self.fs.open_input_stream(self.path(*parts)) as f:
            return f.read()

    def read_json(self, *parts: str) -> Any:
        return json.loads(self.read_bytes(*parts).decode())

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Write atomically where the filesystem allows (local: temp file + rename; object stores: one PUT)."""
        target = self.path(*parts)
        self.fs.create_dir(posixpath.dirname(target), recursive=True)
        if self.local:
            tmp = target + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        else:
            with self.fs.open_output_stream(target) as f:
                f.write(data)

    def write_json(self, obj: Any, *parts: str) -> None:
        self.write_bytes((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), *parts)

    def delete_dir(self, *parts: str) -> None:
        if self.exists(*parts):
            self.fs.delete_dir(self.path(*parts))

    def copy_dir(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        self.delete_dir(*dst)
        pafs.copy_files(self.path(*src), self.path(*dst), source_filesystem=self.fs, destination_filesystem=self.fs)

    def upload_dir(self, local_dir: str, *parts: str) -> None:
        """Mirror a local directory (TensorBoard events, CSV) into the storage."""
        if self.local and os.path.abspath(local_dir) == self.path(*parts):
            return
        pafs.copy_files(local_dir, self.path(*parts), source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)

    def download_dir(self, local_dir: str, *parts: str) -> None:
        """Copy a directory of the storage to the local disk."""
        os.makedirs(local_dir, exist_ok=True)
        pafs.copy_files(self.path(*parts), local_dir, source_filesystem=self.fs, destination_filesystem=pafs.LocalFileSystem())

    def latest_mtime_ns(self, *parts: str) -> int:
        """Newest modification time of the files directly under `parts` (0 if unknown)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(*parts), allow_not_found=True))
        return max((i.mtime_ns or 0 for i in infos if i.type == pafs.FileType.File), default=0)
