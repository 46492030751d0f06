"""What a user installs and reads: dependency floors, the README's numbers, shipped spaces and commands."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from vitplast_tune.search import spaces

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def floors() -> dict[str, tuple[int, ...]]:
    found = {}
    for requirement in PYPROJECT["project"]["dependencies"]:
        name, version = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?>=([0-9.]+)", requirement).groups()
        found[name.lower()] = tuple(int(part) for part in version.split("."))
    return found


def test_dependency_floors_are_the_tested_versions():
    found = floors()
    assert found["ray"] >= (2, 60)  # token authentication of Ray clusters
    assert found["mlflow"] >= (3,)
    assert found["optuna"] >= (5,)
    assert found["timm"] >= (1, 0)
    assert (2,) <= found["torch"] <= (2, 14, 1)


def test_readme_quickstart_trial_counts_match_the_space():
    readme = (ROOT / "README.md").read_text()
    expected = spaces.load_space("component_subsets").num_samples
    quickstart = re.search(r"(\d+) trials of TPE \+ ASHA", readme)
    row = re.search(r"\| `component_subsets` \|[^\n]*\| (\d+) \|", readme)
    example = re.search(r"num_samples: (\d+) +# trials", readme)
    assert [int(m.group(1)) for m in (quickstart, row, example)] == [expected] * 3


@pytest.mark.slow
def test_a_non_editable_install_ships_the_spaces_and_the_commands(tmp_path):
    target = tmp_path / "site"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(target),
        str(ROOT),
    ]
    subprocess.run(pip, check=True, capture_output=True, cwd=tmp_path, timeout=600)
    code = "from vitplast_tune.search import spaces; print(spaces.load_space('component_subsets').num_samples, spaces.spaces_dir())"
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, check=True
    ).stdout
    count, where = out.split()
    assert int(count) == spaces.load_space("component_subsets").num_samples
    assert Path(where).is_relative_to(target)
    for command in ("vitplast-search", "vitplast-analyze", "vitplast-plasticity", "vitplast-pretrain"):
        assert (target / "bin" / command).is_file()
    help_text = subprocess.run(
        [sys.executable, str(target / "bin" / "vitplast-search"), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    ).stdout
    assert "--max-steps" in help_text and "(default: None)" not in help_text
