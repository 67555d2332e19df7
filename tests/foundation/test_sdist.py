"""Dataflow workers install the package from its sdist (``--setup_file ./setup.py``): it must hold
every module of the three packages, every recipe in configs/ and the bundled assets."""

import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tracked(*patterns: str) -> set[str]:
    """The repository's files under ``patterns``: git's list in a clone, the tree itself in a copy without .git."""
    if (REPO / ".git").exists():
        out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
        return {line for line in out.stdout.splitlines() if (REPO / line).exists()}
    # git's pathspec `dir/*.py` matches below dir too; so does `dir/**/*.py` here.
    globs = [pattern.replace("/*", "/**/*", 1) if "/" in pattern else pattern for pattern in patterns]
    return {str(path.relative_to(REPO)) for glob in globs for path in REPO.glob(glob)
            if path.is_file() and "__pycache__" not in path.parts}


def test_sdist_holds_every_module_config_and_asset(tmp_path):
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)], cwd=REPO,
                   check=True, capture_output=True, timeout=300)
    (archive,) = tmp_path.glob("rlax[-_]beam-*.tar.gz")  # older setuptools keep the dash
    with tarfile.open(archive) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = _tracked("rlax_core/*.py", "rlax_core/compile/gpu_targets/*", "transforms/*.py", "pipelines/*.py",
                      "configs/*.yaml", "pipelines/assets/*",
                      "setup.py", "requirements/lock.txt")
    assert wanted, "no source files found"
    missing = sorted(wanted - names)
    assert not missing, f"the sdist lacks: {missing}"
