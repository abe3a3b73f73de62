"""The server starts on its declared dependencies alone: in a process that sees only
pyproject.toml's `dependencies` and what they require (links to their installed files),
as on a machine where only `pip install .` ran, the app and the CLI import and build. (The
suite's environment also holds the test extra, whose packages once hid a missing one:
FastAPI's form parsing, python-multipart, which only test packages brought.)"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def declared() -> set[str]:
    """pyproject.toml's dependencies and what they require, transitively (installed metadata)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        todo = [Requirement(r) for r in tomllib.load(f)["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if _key(req.name) in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            todo += [Requirement(r) for r in md.requires(req.name) or []]
        except md.PackageNotFoundError:  # not installed here: nothing of it to link
            continue
        seen.add(_key(req.name))
    return seen


def runtime_site(folder: Path) -> None:
    """A site folder holding links to the declared distributions' files only (and gguf_serve's
    folders, as bench/cuda.sh links them)."""
    for name in declared():
        dist = md.distribution(name)
        for top in {f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != ".."}:
            target, link = Path(dist.locate_file(top)), folder / top
            if target.exists() and not link.exists():
                link.symlink_to(target)
    (folder / "gguf_serve").mkdir()
    for part in ("gguf_io", "engine", "server"):
        (folder / "gguf_serve" / part).symlink_to(Path(ROOT).resolve() / part)


START = "from gguf_serve.server import cli; from gguf_serve.server.app import create_app; " \
        "create_app(cli.parse_settings([])); print('started')"


def test_the_server_builds_on_its_declared_dependencies_alone(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    runtime_site(site)
    # -S: no site-packages of this environment; only the links
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    got = subprocess.run([sys.executable, "-S", "-c", START], capture_output=True, text=True, timeout=300,
                         env={**env, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert got.returncode == 0 and got.stdout.strip().endswith("started"), got.stderr[-3000:]
