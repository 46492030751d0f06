"""What an install of the package costs: the base package alone (``pip install .``) against the base with LoRA
(``pip install ".[lora]"``, what every install pulled before peft moved to an extra), each into a fresh virtual
environment: the install's wall time, its site-packages' size on disk, and whether peft and transformers came.

pip resolves as this machine's pip configuration says (its find-links, indexes and constraints); run it after an
install of the same versions, so that both installs find the same wheels on disk or in pip's cache.

    python -m benchmarks.install --json install.json
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, add_json_flag, parser, write_json

INSTALLS = {"base": ".", "base+lora": ".[lora]"}


def site_packages(venv: Path) -> Path:
    """The site-packages folder of the virtual environment ``venv``."""
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def size_mb(folder: Path) -> float:
    """The disk usage of ``folder`` in MB (``du``: blocks used, as a user's disk sees it)."""
    kib = int(subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True, check=True).stdout.split()[0])
    return kib / 1024


def measure(requirement: str, scratch: Path) -> dict:
    """Install ``requirement`` from the repository into a fresh virtual environment under ``scratch``; its figures."""
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    before = size_mb(site_packages(venv))
    start = time.perf_counter()
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement], cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
    probe = "import importlib.util as u; print(*(u.find_spec(m) is not None for m in ('peft', 'transformers')))"
    found = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True)
    peft, transformers = (word == "True" for word in found.stdout.split())
    size = size_mb(site_packages(venv)) - before
    return {
        "seconds": round(seconds, 1),
        "site_packages_mb": round(size, 1),
        "peft": peft,
        "transformers": transformers,
    }


def main(argv: list[str] | None = None) -> None:
    """Measure each install in INSTALLS, largest first, and print them side by side."""
    p = parser(__doc__)
    add_json_flag(p)
    args = p.parse_args(argv)
    results = {}
    for name in ("base+lora", "base"):  # the larger first: it warms pip's cache for both
        with tempfile.TemporaryDirectory(prefix=f"install-{name}-") as scratch:
            results[name] = measure(INSTALLS[name], Path(scratch))
        print(name, results[name], flush=True)
    base, full = results["base"], results["base+lora"]
    print(
        f"base: {base['seconds']:.0f} s, {base['site_packages_mb']:.0f} MB; base+lora: {full['seconds']:.0f} s, "
        f"{full['site_packages_mb']:.0f} MB; base/base+lora: {base['seconds'] / full['seconds']:.2f}x the time, "
        f"{base['site_packages_mb'] / full['site_packages_mb']:.2f}x the size"
    )
    write_json(args.json, results)


if __name__ == "__main__":
    main()
