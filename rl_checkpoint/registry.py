"""The policy registry: named policies, numbered versions (each a checkpoint), aliases, and gated promotion.

No server: the registry is a folder or an S3 prefix (the root: `--registry ROOT` or $RL_REGISTRY) holding one
append-only event log per policy,

    <root>/<name>/events/000000001.json     register | alias | promote | rollback | estimate, numbered from 1,
                                            never rewritten

and the state (versions, aliases) is the fold of that log. A writer reads the log, builds the next event from the
state it read (re-running the promotion gate against the champion it sees), and creates event seq+1 only if no
one else has: local storage writes a temp file fully then hard-links it to the name (`link` fails if the name
exists; readers never see a partial file); S3 uses a conditional PUT (`If-None-Match: *`, answered 412 when the
key exists). The loser re-reads and retries. So concurrent writers never tear or lose an update, and every
successful call is exactly one event. pyarrow has no conditional PUT, hence boto3 for the S3 log.

Aliases: any name you set (`set_alias`), plus three the registry owns: `champion` and `previous`, moved only by
promote and rollback, and `latest` (the highest version, computed). Champions form a stack: promote v pushes v
(champion <- v, previous <- the old champion); rollback pops (champion <- previous, previous <- the champion
before that, or none); rollback with no previous champion is refused.

A reference names a version for the policy server and tools:

    registry:<root>/<name>[@<version>|@<alias>][?<the root's URI options>]     default @champion
    registry:<name>[@...]                                                     root from $RL_REGISTRY

e.g. `registry:/srv/registry/cartpole@champion`, `registry:s3://bucket/prefix/cartpole@3?endpoint_override=
127.0.0.1:9000&scheme=http`. The options belong to the root's URI and are written after the name, as a URI's
query follows its path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import getpass
import hashlib
import json
import os
import posixpath
import random
import re
import secrets
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qsl

from rl_checkpoint.checkpoint import CHECKPOINTS_DIR, LATEST, STATE_FILE, Checkpoint, resolve
from rl_checkpoint.errors import CheckpointError, RegistryError
from rl_checkpoint.evaluation import EvalRecord, latest_eval, read_eval_records
from rl_checkpoint.gate import GateDecision, judge, solved_return
from rl_checkpoint.storage import Storage, is_uri, redact

REGISTRY_PREFIX = "registry:"
REGISTRY_ENV = "RL_REGISTRY"
EVENT_FORMAT_VERSION = 1
# `estimate` events (an off-policy estimate recorded with a version, rl_eval.offline) came later: they carry
# format 2, so code that predates them refuses them by their format instead of by an unknown type.
ESTIMATE_EVENT_FORMAT = 2
EVENTS_DIR = "events"
CHAMPION, PREVIOUS, LATEST_ALIAS = "champion", "previous", "latest"
RESERVED_ALIASES = (CHAMPION, PREVIOUS, LATEST_ALIAS)
CONFIG_FILE = "config.yaml"  # the trainer's resolved config in a run dir (hashed into config_hash)
SUMMARY_FILE = "summary.json"
EXIT_BUSY = 3

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_ALIAS = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,62}")  # starts with a letter: never mistaken for a version
_EVENT_FILE = re.compile(r"(\d{9})\.json")


# --------------------------------------------------------------------------------------------- references


def is_registry_ref(location: str) -> bool:
    return location.startswith(REGISTRY_PREFIX)


def parse_ref(location: str) -> tuple[str | None, str, str]:
    """`registry:<root>/<name>[@<ref>][?<options>]` -> (root with its options, name, ref); root None when the
    reference names no root (then $RL_REGISTRY). ref defaults to `champion`."""
    if not is_registry_ref(location):
        raise RegistryError(f"{redact(location)!r} is not a registry reference ({REGISTRY_PREFIX}<root>/<name>@<ref>)")
    rest, _, query = location[len(REGISTRY_PREFIX):].partition("?")
    root, sep, tail = rest.rpartition("/")
    if not sep:
        root = None
    elif not root:
        root = "/"  # registry:/cartpole
    elif root.endswith(":/"):  # registry:s3://bucket: a root with no policy after it
        raise RegistryError(f"registry reference {redact(location)!r} names no policy: "
                            f"{REGISTRY_PREFIX}<root>/<name>[@<ref>]")
    name, _, ref = tail.partition("@")
    ref = ref or CHAMPION
    _check_name(name, f"registry reference {redact(location)!r}")
    if root is not None and query:
        root = f"{root}?{query}"
    elif root is None and query:
        raise RegistryError(f"registry reference {redact(location)!r}: URI options need a root")
    return root, name, ref


def make_ref(root: str, name: str, ref: str | int = CHAMPION) -> str:
    """The reference string `parse_ref` reads back."""
    base, _, query = root.partition("?")
    return f"{REGISTRY_PREFIX}{base.rstrip('/')}/{name}@{ref}" + (f"?{query}" if query else "")


def _check_name(name: str, where: str = "policy name") -> None:
    if not _NAME.fullmatch(name or ""):
        raise RegistryError(f"{where}: policy name {name!r} must be letters, digits, '.', '_' or '-' "
                            "(starting with a letter or digit, at most 63)")


def _check_alias(alias: str) -> None:
    if not _ALIAS.fullmatch(alias or ""):
        raise RegistryError(f"alias {alias!r} must start with a letter and hold only letters, digits, '.', '_' "
                            "or '-' (at most 63)")
    if alias in RESERVED_ALIASES:
        raise RegistryError(f"alias {alias!r} is the registry's own ({', '.join(RESERVED_ALIASES)}): champion and "
                            "previous move with promote and rollback, latest is the newest version")


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Version:
    """One registered checkpoint of a policy."""

    name: str
    version: int  # 1, 2, ... in registration order
    checkpoint: str  # where to resolve it again (a local path or a URI with its options; shown redacted)
    checkpoint_id: str
    env: str | None
    eval: list[dict[str, Any]]  # EvalRecord summaries at registration, oldest first
    config_hash: str | None  # sha256 of the run's config.yaml when the checkpoint is inside a run dir
    git_commit: str | None
    run_dir: str | None
    created: str
    registered_by: str  # user@host
    aliases: tuple[str, ...] = ()  # computed from the log, not stored with the version
    extra: dict[str, Any] = field(default_factory=dict)  # what the caller of register() added
    # Off-policy estimates on logged data (rl_eval.offline records, oldest first): shown, never read by the gate.
    offline_estimates: list[dict[str, Any]] = field(default_factory=list)
    eval_records: tuple[EvalRecord, ...] = field(default=(), repr=False, compare=False)  # full, for the gate

    def to_json(self) -> dict[str, Any]:
        """For display and `--json`: secrets redacted, eval as summaries."""
        out = dataclasses.asdict(self)
        del out["eval_records"]
        out["checkpoint"] = redact(self.checkpoint)
        out["aliases"] = list(self.aliases)
        return out

    def _stored(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("aliases", "eval", "eval_records"):
            del out[key]
        out["eval_records"] = [r.to_json() for r in self.eval_records]
        return out

    @classmethod
    def _from_stored(cls, raw: dict[str, Any], aliases: tuple[str, ...], where: str) -> "Version":
        records = tuple(EvalRecord.from_json(r, where) for r in raw.get("eval_records", []))
        names = {f.name for f in dataclasses.fields(cls)} - {"aliases", "eval", "eval_records"}
        return cls(**{k: v for k, v in raw.items() if k in names}, aliases=aliases,
                   eval=[r.summary() for r in records], eval_records=records)


@dataclass(frozen=True)
class PromotionResult:
    name: str
    version: int  # the champion now
    previous: int | None  # the champion before
    decision: GateDecision
    forced: bool  # the gate refused and force_reason overrode it
    force_reason: str | None
    seq: int  # the promote event's number in the log


class PromotionRefused(RegistryError):
    """The gate refused the promotion; `decision` holds the rule and the figures."""

    def __init__(self, message: str, decision: GateDecision):
        super().__init__(message)
        self.decision = decision


@dataclass
class _Policy:
    """The fold of one policy's events."""

    name: str
    events: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[int, dict[str, Any]] = field(default_factory=dict)  # stored records
    aliases: dict[str, int] = field(default_factory=dict)
    champions: list[int] = field(default_factory=list)  # promote pushes, rollback pops

    def apply(self, ev: dict[str, Any], where: str) -> None:
        kind = ev.get("type")
        if ev.get("format_version", 1) > ESTIMATE_EVENT_FORMAT:
            raise RegistryError(f"{where}: event format_version {ev.get('format_version')} is newer than this code "
                                f"reads ({ESTIMATE_EVENT_FORMAT})")
        if kind == "register":
            self.versions[ev["version"]] = ev["record"]
        elif kind == "estimate":
            raw = self.versions[ev["version"]]
            self.versions[ev["version"]] = {**raw, "offline_estimates": [*raw.get("offline_estimates", []),
                                                                         ev["estimate"]]}
        elif kind in ("alias", "promote", "rollback"):
            for alias, version in ev["aliases"].items():
                if version is None:
                    self.aliases.pop(alias, None)
                else:
                    self.aliases[alias] = version
            if kind == "promote":
                self.champions.append(ev["version"])
            elif kind == "rollback":
                self.champions.pop()
        else:
            raise RegistryError(f"{where}: unknown event type {kind!r}")
        self.events.append(ev)

    def all_aliases(self) -> dict[str, int]:
        out = dict(self.aliases)
        if self.versions:
            out[LATEST_ALIAS] = max(self.versions)
        return out

    @property
    def env(self) -> str | None:
        return self.versions[min(self.versions)].get("env") if self.versions else None


# --------------------------------------------------------------------------------------------- event logs


class _LocalLog:
    """Events as files; create-if-absent by hard-linking a fully written temp file to the event's name."""

    def __init__(self, root: str):
        self.root = root

    def check_root(self, create: bool) -> None:
        if os.path.isdir(self.root):
            return
        if os.path.exists(self.root):
            raise RegistryError(f"registry root {self.root} is not a directory")
        parent = os.path.dirname(self.root.rstrip("/")) or "/"
        if create and os.path.isdir(parent):  # first registration: make the root, never its missing parents
            try:
                os.mkdir(self.root)
                return
            except FileExistsError:
                return
            except OSError as e:
                raise RegistryError(f"registry root {self.root} cannot be created: {e.strerror}") from None
        why = ("" if os.path.isdir(parent) else f" (its parent {parent} is not a directory)" if os.path.exists(parent)
               else f" (nor its parent {parent})")
        raise RegistryError(f"registry root {self.root} does not exist{why}")

    def names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.root)
                      if _NAME.fullmatch(n) and os.path.isfile(os.path.join(self.root, n, EVENTS_DIR, f"{1:09d}.json")))

    def seqs(self, name: str, after: int) -> list[int]:
        try:
            files = os.listdir(os.path.join(self.root, name, EVENTS_DIR))
        except FileNotFoundError:
            return []
        return sorted(s for s in (int(m.group(1)) for m in map(_EVENT_FILE.fullmatch, files) if m) if s > after)

    def read(self, name: str, seq: int) -> bytes:
        with open(self.where(name, seq), "rb") as f:
            return f.read()

    def where(self, name: str, seq: int) -> str:
        return os.path.join(self.root, name, EVENTS_DIR, f"{seq:09d}.json")

    def create(self, name: str, seq: int, data: bytes) -> bool:
        folder = os.path.join(self.root, name, EVENTS_DIR)
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        except OSError as e:
            raise RegistryError(f"registry root {self.root} is not writable: {e.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.where(name, seq))
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):  # e.g. a FUSE mount without links
                    raise RegistryError(f"registry root {self.root}: the filesystem refuses hard links, which the "
                                        f"registry needs for atomic updates ({e.strerror})") from None
                raise
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            return True
        except OSError as e:
            raise RegistryError(f"registry root {self.root} is not writable: {e.strerror}") from None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass


class _S3Log:
    """Events as objects; create-if-absent with a conditional PUT (If-None-Match: *).

    The client is built from the root URI's options (endpoint_override, scheme, region, access_key, secret_key,
    session_token), else boto3's default chain (env, ~/.aws, instance role; AWS_ENDPOINT_URL)."""

    def __init__(self, uri: str):
        base, _, query = uri.partition("?")
        path = base.split("://", 1)[1].strip("/")
        self.bucket, _, self.prefix = path.partition("/")
        self.shown = redact(uri)
        if not self.bucket:
            raise RegistryError(f"registry root {self.shown!r} names no bucket")
        self.options = dict(parse_qsl(query))
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            opts = self.options
            endpoint = opts.get("endpoint_override")
            if endpoint and "://" not in endpoint:
                endpoint = f"{opts.get('scheme', 'https')}://{endpoint}"
            self._client = boto3.client(
                "s3", endpoint_url=endpoint, region_name=opts.get("region"),
                aws_access_key_id=opts.get("access_key"), aws_secret_access_key=opts.get("secret_key"),
                aws_session_token=opts.get("session_token"),
                config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}))
        return self._client

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def where(self, name: str, seq: int) -> str:
        return f"s3://{self.bucket}/{self.key(name, EVENTS_DIR, f'{seq:09d}.json')}"

    def _error(self, e: Exception, what: str) -> RegistryError:
        from botocore.exceptions import ClientError

        if isinstance(e, ClientError):
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket", "404"):
                return RegistryError(f"registry root {self.shown} does not exist (no bucket {self.bucket!r})")
            if code in ("AccessDenied", "403", "Forbidden"):
                return RegistryError(f"registry root {self.shown}: access denied to {what}")
            return RegistryError(f"registry root {self.shown}: cannot {what}: {code or e}")
        return RegistryError(f"registry root {self.shown}: cannot {what}: {e}")  # unreachable, no credentials

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except (BotoCoreError, ClientError) as e:
            raise self._error(e, what) from None

    def check_root(self, create: bool) -> None:  # the bucket must exist; a prefix exists once written to
        self._call("read the bucket", lambda: self.client.head_bucket(Bucket=self.bucket))

    def _list(self, **kw: Any) -> list[dict[str, Any]]:
        pages = self._call("list the registry", lambda: list(
            self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kw)))
        return pages

    def names(self) -> list[str]:
        prefix = self.key() + "/" if self.prefix else ""
        pages = self._list(Prefix=prefix, Delimiter="/")
        names = [p["Prefix"][len(prefix):].rstrip("/") for page in pages for p in page.get("CommonPrefixes", [])]
        return sorted(n for n in names if _NAME.fullmatch(n) and self.seqs(n, 0, limit=1))

    def seqs(self, name: str, after: int, limit: int | None = None) -> list[int]:
        prefix = self.key(name, EVENTS_DIR) + "/"
        kw: dict[str, Any] = {"Prefix": prefix, "StartAfter": prefix + f"{after:09d}.json"}
        if limit:
            kw["PaginationConfig"] = {"MaxItems": limit}
        found = [o["Key"][len(prefix):] for page in self._list(**kw) for o in page.get("Contents", [])]
        return sorted(int(m.group(1)) for m in map(_EVENT_FILE.fullmatch, found) if m)

    def read(self, name: str, seq: int) -> bytes:
        key = self.key(name, EVENTS_DIR, f"{seq:09d}.json")
        return self._call(f"read {key}", lambda: self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def create(self, name: str, seq: int, data: bytes) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.key(name, EVENTS_DIR, f"{seq:09d}.json")
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*",
                                   ContentType="application/json")
        except ClientError as e:
            # 412: the key exists; 409: a concurrent conditional PUT of the same key is in flight. Either way
            # another writer has (or is taking) this number.
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                # ... unless it is this very event, written by an attempt botocore retried after a lost reply
                # (every event carries a random id, so equal bytes mean ours).
                try:
                    return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read() == data
                except (BotoCoreError, ClientError):
                    return False
            raise self._error(e, f"write {key}") from None
        except BotoCoreError as e:
            raise self._error(e, f"write {key}") from None
        return True


# --------------------------------------------------------------------------------------------- the registry


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class Registry:
    """A registry root: a local folder or `s3://bucket/prefix[?options]`."""

    # Writers that lose the race for an event number re-read and try again, this long at most.
    retry_deadline_s = 60.0

    def __init__(self, root: str):
        if not root:
            raise RegistryError(f"no registry: pass --registry ROOT or set {REGISTRY_ENV}")
        if is_uri(root):
            scheme = root.split("://", 1)[0].lower()
            if scheme != "s3":
                raise RegistryError(f"registry root {redact(root)!r}: scheme {scheme!r} is not supported (a local "
                                    "folder or s3://bucket/prefix)")
            self.root = root
            self._log: _LocalLog | _S3Log = _S3Log(root)
        else:
            self.root = os.path.abspath(os.path.expanduser(root))
            self._log = _LocalLog(self.root)
        self._policies: dict[str, _Policy] = {}
        self._root_checked = False
        self.conflicts = 0  # event numbers this instance lost to other writers (and retried)

    @classmethod
    def open(cls, root: str | None = None) -> "Registry":
        return cls(root if root is not None else os.environ.get(REGISTRY_ENV, ""))

    @property
    def shown(self) -> str:
        return redact(self.root)

    # ------------------------------------------------------------------ reading

    def _check_root(self, create: bool = False) -> None:
        if not self._root_checked or create:
            self._log.check_root(create)
            self._root_checked = True

    def _load(self, name: str) -> _Policy:
        """The policy's state, reading only events not read before (events never change once written)."""
        _check_name(name)
        self._check_root()
        pol = self._policies.setdefault(name, _Policy(name))
        for seq in self._log.seqs(name, len(pol.events)):
            if seq != len(pol.events) + 1:
                raise RegistryError(f"{self._log.where(name, seq)}: event {seq} follows event {len(pol.events)} "
                                    "(the log has a gap: restored from a partial copy?)")
            where = redact(self._log.where(name, seq))
            try:
                ev = json.loads(self._log.read(name, seq))
            except (OSError, ValueError) as e:
                raise RegistryError(f"{where}: unreadable registry event ({e})") from None
            if not isinstance(ev, dict) or ev.get("seq") != seq:
                raise RegistryError(f"{where}: not a registry event for seq {seq}")
            pol.apply(ev, where)
        return pol

    def _existing(self, name: str) -> _Policy:
        pol = self._load(name)
        if not pol.events:
            known = self.names()
            raise RegistryError(f"no policy {name!r} in registry {self.shown} "
                                f"({'policies: ' + ', '.join(known) if known else 'it is empty'})")
        return pol

    def names(self) -> list[str]:
        self._check_root()
        return self._log.names()

    def _version(self, pol: _Policy, raw: dict[str, Any]) -> Version:
        aliases = tuple(sorted(a for a, v in pol.all_aliases().items() if v == raw["version"]))
        return Version._from_stored(raw, aliases, f"registry {self.shown} {pol.name} v{raw['version']}")

    def _number(self, pol: _Policy, ref: str | int) -> int:
        """A version number, "3", "v3" or an alias -> the version number it names now."""
        text = str(ref).strip()
        if re.fullmatch(r"v?\d+", text):
            number = int(text.lstrip("v"))
            if number in pol.versions:
                return number
        elif text in pol.all_aliases():
            return pol.all_aliases()[text]
        aliases = ", ".join(f"{a}->v{v}" for a, v in sorted(pol.all_aliases().items())) or "none"
        span = f"v1..v{max(pol.versions)}" if pol.versions else "none"
        raise RegistryError(f"policy {pol.name!r} has no version or alias {text!r} (versions: {span}; aliases: "
                            f"{aliases})")

    def versions(self, name: str) -> list[Version]:
        pol = self._existing(name)
        return [self._version(pol, pol.versions[v]) for v in sorted(pol.versions)]

    def get(self, name: str, ref: str | int = CHAMPION) -> Version:
        pol = self._existing(name)
        return self._version(pol, pol.versions[self._number(pol, ref)])

    def aliases(self, name: str) -> dict[str, int]:
        return self._existing(name).all_aliases()

    def history(self, name: str) -> list[dict[str, Any]]:
        return [dict(ev) for ev in self._existing(name).events]

    # ------------------------------------------------------------------ writing

    def _commit(self, name: str, build: Callable[[_Policy], dict[str, Any] | None]) -> tuple[dict[str, Any] | None,
                                                                                                _Policy]:
        """Append the event `build` makes from the current state, retrying from a fresh read when another writer
        took the number first. `build` may return None (nothing to write) or raise (a refusal)."""
        deadline = time.monotonic() + self.retry_deadline_s
        delay = 0.002
        while True:
            pol = self._load(name)
            body = build(pol)
            if body is None:
                return None, pol
            seq = len(pol.events) + 1
            ev = {"format_version": EVENT_FORMAT_VERSION, "seq": seq, "id": secrets.token_hex(8), "time": _now(),
                  "by": _who(), **body}
            if self._log.create(name, seq, (json.dumps(ev, indent=2, sort_keys=True) + "\n").encode()):
                pol.apply(ev, self._log.where(name, seq))
                return ev, pol
            self.conflicts += 1
            if time.monotonic() > deadline:
                raise RegistryError(f"registry {self.shown}: policy {name!r} stayed busy (other writers took every "
                                    f"event number for {self.retry_deadline_s:g}s); try again", EXIT_BUSY)
            time.sleep(random.uniform(0, delay))
            delay = min(delay * 2, 0.25)

    def register(self, name: str, checkpoint: str, *, select: str = LATEST, **extra: Any) -> Version:
        """Add `checkpoint` (a checkpoint, RLModule or run directory; a path or URI) as the policy's next version.
        Registering the same checkpoint (same id and location) again returns its existing version.
        `extra` keys named like Version fields (git_commit, config_hash, run_dir) override what is found."""
        _check_name(name)
        ckpt = resolve(checkpoint, select)  # before the root is made: a bad checkpoint leaves nothing behind
        self._check_root(create=True)
        ckpt_id = ckpt.checkpoint_id
        location = ckpt.storage.uri()
        env = ckpt.metadata.env if ckpt.metadata else None
        records = tuple(r for r in read_eval_records(ckpt.storage) if r.checkpoint_id == ckpt_id)
        run = _run_info(ckpt)
        fields = {"config_hash": run.get("config_hash"), "git_commit": run.get("git_commit"),
                  "run_dir": run.get("run_dir")}
        for key in list(extra):
            if key in fields:
                fields[key] = extra.pop(key)
        if fields["run_dir"] and fields["config_hash"] is None:  # a run dir given by the caller
            fields["config_hash"] = _config_hash(fields["run_dir"])
        if fields["git_commit"] is None:
            fields["git_commit"] = _cwd_git_commit()

        def build(pol: _Policy) -> dict[str, Any] | None:
            for number, raw in pol.versions.items():
                if raw["checkpoint_id"] == ckpt_id and raw["checkpoint"] == location:
                    return None
            if pol.versions and env != pol.env:
                raise RegistryError(f"checkpoint {redact(location)} is for env {env!r}, policy {name!r} for "
                                    f"{pol.env!r} (register it under another name)")
            number = max(pol.versions, default=0) + 1
            version = Version(name=name, version=number, checkpoint=location, checkpoint_id=ckpt_id, env=env,
                              eval=[], created=_now(), registered_by=_who(), extra=extra, eval_records=records,
                              **fields)
            return {"type": "register", "version": number, "record": version._stored()}

        ev, pol = self._commit(name, build)
        if ev is None:
            return next(self._version(pol, raw) for raw in pol.versions.values()
                        if raw["checkpoint_id"] == ckpt_id and raw["checkpoint"] == location)
        return self._version(pol, pol.versions[ev["version"]])

    def set_alias(self, name: str, alias: str, version: str | int) -> Version:
        """Point `alias` at `version` (a number or another alias). Not for champion/previous/latest."""
        _check_alias(alias)

        def build(pol: _Policy) -> dict[str, Any]:
            number = self._number(pol, version)
            return {"type": "alias", "alias": alias, "version": number, "aliases": {alias: number}}

        self._existing(name)
        ev, pol = self._commit(name, build)
        return self._version(pol, pol.versions[ev["version"]])

    def record_estimate(self, name: str, version: str | int, estimate: dict[str, Any]) -> Version:
        """Add an off-policy estimate (rl_eval.offline's record, as JSON) to the version it was made of."""
        def build(pol: _Policy) -> dict[str, Any]:
            number = self._number(pol, version)
            ckpt_id = pol.versions[number]["checkpoint_id"]
            if estimate.get("checkpoint_id") != ckpt_id:
                raise RegistryError(f"the estimate is of checkpoint {estimate.get('checkpoint_id')!r}, {name} "
                                    f"v{number} is {ckpt_id!r}")
            return {"type": "estimate", "version": number, "estimate": estimate,
                    "format_version": ESTIMATE_EVENT_FORMAT}

        self._existing(name)
        ev, pol = self._commit(name, build)
        return self._version(pol, pol.versions[ev["version"]])

    def gate(self, name: str, version: str | int, *, min_return: float | None = None) -> GateDecision:
        """The decision `promote` would take now, without promoting."""
        pol = self._existing(name)
        return self._decide(pol, self._number(pol, version), min_return, {})

    def _decide(self, pol: _Policy, number: int, min_return: float | None,
                cache: dict[int, EvalRecord | None]) -> GateDecision:
        for v in (number, pol.aliases.get(CHAMPION)):
            if v is not None and v not in cache:
                cache[v] = self._current_eval(pol, v, candidate=v == number)
        champion = pol.aliases.get(CHAMPION)
        raw = pol.versions[number]
        return judge(cache[number], cache[champion] if champion is not None else None, min_return=min_return,
                     env_solved=solved_return(raw.get("env")), candidate_name=f"{pol.name} v{number}",
                     champion_name=f"champion v{champion}")

    def _current_eval(self, pol: _Policy, number: int, candidate: bool) -> EvalRecord | None:
        """The newest evaluation of the version's checkpoint: its records now, else those stored at register.
        The candidate's checkpoint must still be there and unchanged (it is what will be served)."""
        raw = pol.versions[number]
        stored = [EvalRecord.from_json(r, f"{pol.name} v{number}") for r in raw.get("eval_records", [])]
        try:
            ckpt = self._checked(pol.name, raw)
            current = read_eval_records(ckpt.storage)
        except CheckpointError:
            if candidate:
                raise
            current = []  # the champion's checkpoint is gone: judge it by what was recorded
        return latest_eval(stored + current, raw["checkpoint_id"])

    def _checked(self, name: str, raw: dict[str, Any]) -> Checkpoint:
        """The version's checkpoint, resolved; refused when it is gone or was rewritten since registration."""
        shown = redact(raw["checkpoint"])
        try:
            ckpt = resolve(raw["checkpoint"])
        except CheckpointError as e:
            raise RegistryError(f"{name} v{raw['version']}: its checkpoint cannot be read: {e}") from None
        if ckpt.checkpoint_id != raw["checkpoint_id"]:
            raise RegistryError(f"{name} v{raw['version']}: checkpoint {shown} changed since registration (id "
                                f"{raw['checkpoint_id']!r}, now {ckpt.checkpoint_id!r}); register it again")
        return ckpt

    def promote(self, name: str, version: str | int, *, min_return: float | None = None,
                force_reason: str | None = None) -> PromotionResult:
        """Make `version` the champion if the gate allows it (or `force_reason` overrides a refusal; the reason is
        recorded). The old champion becomes `previous`. Raises PromotionRefused with the gate's decision."""
        if force_reason is not None and not force_reason.strip():
            raise RegistryError("a forced promotion needs a reason (--force REASON)")
        cache: dict[int, EvalRecord | None] = {}
        outcome: dict[str, Any] = {}

        def build(pol: _Policy) -> dict[str, Any]:
            number = self._number(pol, version)
            old = pol.aliases.get(CHAMPION)
            if number == old:
                raise RegistryError(f"{name} v{number} is already the champion")
            decision = self._decide(pol, number, min_return, cache)
            forced = not decision.allowed
            if forced and (force_reason is None or not decision.forceable):
                how = "" if not decision.forceable else " (--force REASON overrides)"
                raise PromotionRefused(f"promotion of {name} v{number} refused by {decision.message}{how}", decision)
            outcome.update(decision=decision, forced=forced)
            return {"type": "promote", "version": number, "from": old,
                    "aliases": {CHAMPION: number, PREVIOUS: old}, "gate": decision.to_json(),
                    "forced": forced, "force_reason": force_reason, "min_return": min_return}

        self._existing(name)
        ev, _ = self._commit(name, build)
        return PromotionResult(name, ev["version"], ev["from"], outcome["decision"], outcome["forced"], force_reason,
                               ev["seq"])

    def rollback(self, name: str) -> PromotionResult:
        """champion <- previous, previous <- the champion before that (or none)."""
        def build(pol: _Policy) -> dict[str, Any]:
            if len(pol.champions) < 2:
                raise RegistryError(f"{name} has no previous champion to roll back to"
                                    + (f" (champion v{pol.champions[-1]} is the first)" if pol.champions else ""))
            back, before = pol.champions[-2], (pol.champions[-3] if len(pol.champions) > 2 else None)
            self._checked(name, pol.versions[back])
            return {"type": "rollback", "version": back, "from": pol.champions[-1],
                    "aliases": {CHAMPION: back, PREVIOUS: before}}

        self._existing(name)
        ev, _ = self._commit(name, build)
        decision = GateDecision(True, "rollback", f"rolled back from v{ev['from']}")
        return PromotionResult(name, ev["version"], ev["aliases"][PREVIOUS], decision, False, None, ev["seq"])


# --------------------------------------------------------------------------------------------- provenance


def _run_info(ckpt: Checkpoint) -> dict[str, Any]:
    """run_dir, config_hash and git_commit when the checkpoint sits in a run dir (<run>/checkpoints/<name>)."""
    st = ckpt.storage
    parent = posixpath.dirname(st.root.rstrip("/"))
    if posixpath.basename(parent) != CHECKPOINTS_DIR:
        return {}
    run_root = posixpath.dirname(parent)
    if st.local:
        run_location = run_root
    else:
        base = st.location.split("?", 1)[0].rstrip("/").rsplit("/", 2)[0]
        run_location = f"{base}?{st.query}" if st.query else base
    run = Storage(run_location, st.fs, run_root, st.query)
    try:
        if not (run.is_file(CONFIG_FILE) or run.is_file(STATE_FILE)):
            return {}
        out: dict[str, Any] = {"run_dir": run.uri()}
        if run.is_file(CONFIG_FILE):
            out["config_hash"] = hashlib.sha256(run.read_bytes(CONFIG_FILE)).hexdigest()
        if run.is_file(SUMMARY_FILE):
            commit = run.read_json(SUMMARY_FILE).get("git_commit")
            if isinstance(commit, str) and commit:
                out["git_commit"] = commit
    except (OSError, ValueError, CheckpointError):
        return {}
    return out


def _config_hash(run_dir: str) -> str | None:
    try:
        run = Storage.open(run_dir, create=False)
        return hashlib.sha256(run.read_bytes(CONFIG_FILE)).hexdigest() if run.is_file(CONFIG_FILE) else None
    except (OSError, CheckpointError):
        return None


def _cwd_git_commit() -> str | None:
    """HEAD of the working directory's git checkout, when there is one (the code registering the policy)."""
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", out) else None


def resolve_ref(location: str) -> tuple[Version, Checkpoint]:
    """A `registry:` reference -> the version it names now and its resolved checkpoint (for the policy server).
    Raises RegistryError when the policy, version or alias is unknown or the checkpoint is gone or changed."""
    root, name, ref = parse_ref(location)
    registry = Registry.open(root)
    version = registry.get(name, ref)
    pol = registry._existing(name)
    return version, registry._checked(name, pol.versions[version.version])
