"""The wheel: built from the repository, installed on its own, every subpackage imports from it.

pyproject maps top-level folders to `mugraph.*` packages; a module or folder the mapping misses
works in the editable checkout but is absent from the wheel. This test catches that.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"mugraph": "mugraph", "mugraph.ir": "ir", "mugraph.verify": "verify",
                "mugraph.search": "search", "mugraph.codegen": "codegen",
                "mugraph.kernels_generated": "kernels_generated"}
# data files the package needs at run time (pyproject's package-data)
DATA_FILES = {"mugraph/codegen/runtime": ("codegen/runtime", ("*.cuh", "*.h")),
              "mugraph/kernels_generated": ("kernels_generated", ("*.json", "*.cu", "*.md"))}
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".hypothesis", ".pytest_cache", ".mugraph-cache", "tests", ".notes")


def _run(args, **kw):
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, args))} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"  # a copy, so the build leaves no build/ or egg-info in the checkout
    shutil.copytree(ROOT, src, ignore=SKIP)
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--quiet",
          "--disable-pip-version-check", "-w", str(tmp_path / "dist")])
    (wheel,) = (tmp_path / "dist").glob("mugraph-*.whl")
    return wheel


def _repo_modules() -> set[str]:
    """Every module file under the package folders, as its path inside the wheel."""
    found = set()
    for package, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base)
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            if all((base / Path(*rel.parts[:i]) / "__init__.py").exists()
                   for i in range(len(rel.parts))):  # inside a package, not a loose script folder
                found.add("/".join(package.split(".") + list(rel.parts)))
    return found


def _repo_data_files() -> set[str]:
    found = set()
    for prefix, (folder, patterns) in DATA_FILES.items():
        for pattern in patterns:
            found |= {f"{prefix}/{p.relative_to(ROOT / folder).as_posix()}"
                      for p in (ROOT / folder).rglob(pattern)}
    return found


def test_wheel_installs_and_every_subpackage_imports_from_it(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _repo_modules() - names
    assert not missing, f"modules in the repository but not in the wheel: {sorted(missing)}"
    missing = _repo_data_files() - names
    assert not missing, f"data files in the repository but not in the wheel: {sorted(missing)}"

    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
          "--disable-pip-version-check", "--target", str(target), str(wheel)])
    code = ("import importlib, json, sys\n"
            f"names = {sorted(PACKAGE_DIRS)!r}\n"
            "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n")
    env = dict(os.environ, PYTHONPATH=str(target))
    files = _run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    for name, file in __import__("json").loads(files).items():
        assert Path(file).resolve().is_relative_to(target.resolve()), \
            f"{name} imported from {file}, not from the installed wheel"
