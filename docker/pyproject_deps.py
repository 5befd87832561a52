"""Print the project's runtime dependencies, one per line, exactly as pyproject.toml pins them.

Used by hack/images.sh (wheelhouse key and contents) and by the Dockerfiles' `reqs` stage, so the dependency
layer of an image depends on this list only, not on every edit of pyproject.toml.
"""
import sys
import tomllib

with open(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
for dep in deps:
    print(dep.strip())
