"""Output location: a local path or any URI pyarrow understands (s3://, gs://, ...), so pods can write to shared
storage. Small files go through pyarrow's filesystem; checkpoints are written by RLlib with the same filesystem."""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from trainer.errors import TrainerError


def is_uri(location: str) -> bool:
    return "://" in location


@dataclass
class Storage:
    location: str  # as the user gave it (absolute for local paths)
    fs: pafs.FileSystem
    root: str  # path inside fs
    query: str = ""  # URI options (e.g. ?endpoint_override=...&scheme=http), kept on derived URIs

    @classmethod
    def open(cls, location: str) -> "Storage":
        if not is_uri(location):
            location = os.path.abspath(location)
            os.makedirs(location, exist_ok=True)
            return cls(location, pafs.LocalFileSystem(), location)
        try:
            fs, root = pafs.FileSystem.from_uri(location)
        except Exception as e:  # pyarrow raises ArrowInvalid/OSError variants for bad URIs or credentials
            raise TrainerError(f"cannot open output_dir {location!r}: {e}") from e
        query = location.split("?", 1)[1] if "?" in location else ""
        return cls(location, fs, root.rstrip("/"), query)

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def uri(self, *parts: str) -> str:
        """A user-facing location for `parts` (a local path, or a URI)."""
        if self.local:
            return os.path.join(self.location, *parts)
        base = self.location.split("?", 1)[0].rstrip("/")
        uri = "/".join([base, *parts]) if parts else base
        return f"{uri}?{self.query}" if self.query else uri

    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def mkdir(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def read_json(self, *parts: str) -> Any:
        with self.fs.open_input_stream(self.path(*parts)) as f:
            return json.loads(f.read().decode())

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
        """Mirror a local directory (TensorBoard events, CSV) into the output location."""
        if self.local and os.path.abspath(local_dir) == self.path(*parts):
            return
        pafs.copy_files(local_dir, self.path(*parts), source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)
