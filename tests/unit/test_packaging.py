"""The project builds as a wheel without setuptools warnings and ships every Hydra config group."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_builds_clean_with_every_hydra_yaml(tmp_path):
    # --no-build-isolation: the venv's setuptools, no index needed; build/ and egg-info go to a copy, not the repo.
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for rel in files:
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((REPO / rel).read_bytes())
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "Warning" not in out, [ln for ln in out.splitlines() if "Warning" in ln][:5]
    (wheel,) = (tmp_path / "dist").glob("rl_platform-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("hydra_conf/") and n.endswith(".yaml")}
    assert shipped == {str(p.relative_to(REPO)) for p in (REPO / "hydra_conf").rglob("*.yaml")}
    # rl-submit is its own package beside the trainer, and its console script points there.
    names = zipfile.ZipFile(wheel).namelist()
    assert {"rl_submit/cli.py", "rl_submit/shape.py", "rl_submit/__main__.py"} <= set(names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "rl-submit = rl_submit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
