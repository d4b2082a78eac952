"""A virtual environment holding only what the lent GPU machine's image holds, built offline.

The image (its list of "Python packages already there", as the lent machines' documentation gave it on
2026-11-17) has torch, transformers, pytest, prometheus-client ... but no PySide6, pyqtgraph, qasync, pytest-qt,
platformdirs, gguf, FastAPI, Starlette, uvicorn or pydantic. This venv links, from the running interpreter's
site-packages, exactly the installed distributions that the image also has (the CPU torch standing in
for the image's CUDA torch); everything else is absent, as it is there. Nothing is downloaded or copied:
each distribution's top-level files are symlinked, so building it takes a second.
"""
from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

# The image's packages that this project's code or its dependencies may import (a subset of the
# image's list; names as pip spells them). Not here, on purpose: everything the image lacks.
IMAGE_PACKAGES = (
    "accelerate", "annotated-doc", "anyio", "certifi", "charset-normalizer", "click", "colorama", "filelock",
    "fsspec", "h11", "hf-xet", "httpcore", "httpx", "huggingface-hub", "hypothesis", "idna", "iniconfig",
    "jinja2", "markdown-it-py", "markupsafe", "mdurl", "mpmath", "networkx", "ninja", "numpy", "nvidia-ml-py",
    "packaging", "peft", "pluggy", "prometheus-client", "psutil", "pygments", "pytest", "pytest-timeout",
    "pyyaml", "regex", "requests", "rich", "safetensors", "setuptools", "shellingham", "sortedcontainers",
    "sympy", "tokenizers", "torch", "tqdm", "transformers", "triton", "typer", "typing-extensions", "urllib3",
)
# What the image lacks and the check must do without: never linked, even where a local version of an
# image package asks for it.
ABSENT = ("pyside6", "pyside6-essentials", "shiboken6", "pyqtgraph", "qasync", "pytest-qt", "platformdirs", "gguf",
          "fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core")
# Must be present here for the stand-in to mean anything.
REQUIRED = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "jinja2", "pytest", "prometheus-client")


def _top_level_entries(dist: md.Distribution) -> set[Path]:
    """The paths directly under site-packages that `dist` installed (packages, modules, its dist-info)."""
    site = Path(dist.locate_file(""))
    entries = set()
    for f in dist.files or ():
        parts = Path(f).parts
        if parts and parts[0] != ".." and not parts[0].startswith("__pycache__"):
            entries.add(site / parts[0])
    return entries


def build_image_venv(target: Path) -> Path:
    """A venv at `target` with only IMAGE_PACKAGES (those installed here); its python's path.
    Raises RuntimeError (with the reason) where it cannot be built offline."""
    missing = [name for name in REQUIRED if not _installed(name)]
    if missing:
        raise RuntimeError(f"not installed here, so no stand-in for the image: {', '.join(missing)}")
    proc = subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(target)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m venv failed: {proc.stderr.strip()[-500:]}")
    python = target / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    for name in sorted(_closure(IMAGE_PACKAGES)):
        for entry in _top_level_entries(md.distribution(name)):
            link = site / entry.name
            if entry.exists() and not link.exists():
                link.symlink_to(entry)
    return python


def _closure(names) -> set[str]:
    """`names` (those installed here) and what their installed versions require, less ABSENT: the local
    versions may need a package the image's older versions did not (huggingface-hub 2 needs httpx2)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [n for n in names if _installed(n)]
    while todo:
        name = _canonical(todo.pop())
        if name in seen or name in ABSENT or not _installed(name):
            continue
        seen.add(name)
        for text in md.distribution(name).requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True
