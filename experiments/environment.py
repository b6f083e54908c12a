"""Where a measurement was taken: GPU, driver, CUDA, torch, triton, the workloads' libraries, this repo's
commit, host CPU, date.

Stored in every record, so that any number can be traced to the machine and code that produced it.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
CODE = ("grace", "experiments", "conf")  # what a measurement's result depends on in this repo
# the packages the workloads' models come from: their code is the model's (HF's T5 attention, say)
LIBRARIES = ("torchvision", "transformers", "timm")
READERS = ("experiments/figures.py", "experiments/report.py")  # they read records, never make them: a
# figure's fix leaves the records of the code before it current
CORPUS = ("experiments/corpus", "conf/experiment/corpus.yaml")  # the corpus's own code, which the suite never
# runs: a corpus fix leaves the suite's records current (the corpus's records keep both hashes)


@dataclass(frozen=True)
class Environment:
    device: str  # "cuda" or "cpu"
    gpu: str | None  # torch.cuda.get_device_name(), None without CUDA
    driver: str | None  # NVIDIA driver version
    cuda: str | None  # CUDA version torch was built with
    torch: str
    triton: str | None
    python: str
    git_commit: str  # "<sha>" or "<sha>-dirty"; GRACE_GIT_COMMIT when the tree has no .git
    host: str
    date: str  # UTC, ISO 8601
    gpus: str | None = None  # "<visible to this process> of <on the host>": "1 of 2" when a second sweep may share the host
    cpu: str | None = None  # "<model>, <n> cores": host-bound workloads' times depend on it
    load: float | None = None  # the host's 1-minute load average when the session began
    code: str | None = None  # hash of CODE's files as they ran but CORPUS's: equal across commits that only add results
    corpus: str | None = None  # in the corpus's records, the hash of CORPUS's files: with `code`, what it ran
    libraries: dict[str, str] | None = None  # LIBRARIES' versions, those installed


def _git_commit() -> str:
    """GRACE_GIT_COMMIT when set (the device machine's copy of .git is the session's first snapshot, so
    its HEAD is stale: the caller passes the commit it sent), else HEAD and whether the tree is dirty."""
    if os.environ.get("GRACE_GIT_COMMIT"):
        return os.environ["GRACE_GIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout
        return sha.strip() + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def code_hash(parts: tuple[str, ...] = CODE, leave_out: tuple[str, ...] = READERS + CORPUS) -> str:
    """The files of `parts` (folders or files; Python and YAML) as they lie, but those under `leave_out`,
    names and contents: unlike git_commit, the same after a commit of records, and right on the device
    machine, whose .git is a stale snapshot."""
    h = hashlib.sha256()
    for part in parts:
        root = REPO / part
        for f in [root] if root.is_file() else sorted(root.rglob("*")):
            name = str(f.relative_to(REPO))
            if (f.suffix in (".py", ".yaml") and f.is_file()
                    and not any(name == o or name.startswith(o + "/") for o in leave_out)):
                h.update(f"{name}\0".encode() + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _driver_versions() -> list[str]:
    """One line per GPU on the host (whatever CUDA_VISIBLE_DEVICES hides), empty without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        return out.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


def _cpu() -> str:
    """The host CPU's model (Linux /proc/cpuinfo, else platform.processor()) and its core count."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    except OSError:
        model = None
    name = model.group(1).strip() if model else (platform.processor() or "unknown")
    return f"{name}, {os.cpu_count()} cores"


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # no load average on this platform
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@cache
def current() -> Environment:
    cuda = torch.cuda.is_available()
    drivers = _driver_versions() if cuda else []
    return Environment(
        device="cuda" if cuda else "cpu",
        gpu=torch.cuda.get_device_name() if cuda else None,
        driver=drivers[0] if drivers else None,
        cuda=torch.version.cuda,
        torch=torch.__version__,
        triton=_version("triton"),
        python=platform.python_version(),
        git_commit=_git_commit(),
        host=platform.node(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpus=f"{torch.cuda.device_count()} of {len(drivers)}" if cuda else None,
        cpu=_cpu(),
        load=_load(),
        code=code_hash(),
        libraries={name: v for name in LIBRARIES if (v := _version(name))},
    )


def device_tag(env: Environment) -> str:
    """Folder name for records of this kind of machine: 'nvidia-h200', or 'cpu'."""
    if env.gpu is None:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", env.gpu.lower()).strip("-")
