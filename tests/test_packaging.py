"""What a user installs and reads: dependency floors, the README's numbers, shipped spaces and commands."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vitplast_tune.space import load_space

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


def test_the_quickstarts_trial_counts_in_the_readme_and_the_guide_match_the_space():
    readme, guide = (ROOT / "README.md").read_text(), (ROOT / "docs" / "guide" / "spaces.md").read_text()
    expected = load_space("component_subsets").num_samples
    quickstart = re.search(r"(\d+) trials of TPE \+ ASHA", readme)
    row = re.search(r"\| `component_subsets` \|[^\n]*\| (\d+) \|", guide)
    example = re.search(r"num_samples: (\d+) +# trials", guide)
    assert [int(m.group(1)) for m in (quickstart, row, example)] == [expected] * 3


def test_the_license_file_is_the_one_pyproject_declares():
    assert PYPROJECT["project"]["license"] == "MIT" and PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "Copyright (c) 2026 the vitplast_tune authors" in text


def test_the_quickstart_installs_without_dev_tools_and_the_tests_with_them():
    readme = (ROOT / "README.md").read_text()
    quickstart = re.findall(r"```bash\n(.*?)```", readme.split("## Quickstart", 1)[1], re.S)
    tests = re.findall(r"```bash\n(.*?)```", readme.split("## Tests", 1)[1], re.S)
    assert quickstart[0] == "pip install -e . && python scripts/search.py --space component_subsets --name quickstart\n"
    assert tests[0].startswith('pip install -e ".[dev]" && python -m pytest'), tests[0]
    ci = (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command
    assert 'python -m pip install -e ".[dev,docs]"' in ci and re.search(
        r"^VITPLAST_STRICT_SKIPS=1 python -m pytest", ci, re.M
    )


@pytest.mark.slow
def test_a_wheel_ships_the_spaces_weights_and_commands_and_searches_from_them(tmp_path):
    """Build the wheel, install it alone (no checkout on the path), and run the quickstart's space from it."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels)]
    subprocess.run([*build, str(ROOT)], check=True, capture_output=True, cwd=tmp_path, timeout=600)
    (wheel,) = wheels.glob("vitplast_tune-*.whl")
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, cwd=tmp_path, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "from vitplast_tune.space import spaces_dir; print(spaces_dir())"
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(target), where.stderr
    (dist_info,) = target.glob("vitplast_tune-*.dist-info")
    assert "License-Expression: MIT" in (dist_info / "METADATA").read_text()
    assert (dist_info / "licenses" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    commands = ("vitplast-search", "vitplast-analyze", "vitplast-plasticity", "vitplast-pretrain", "vitplast-recommend")
    commands += ("vitplast-ui", "vitplast-lab")
    for command in commands:
        assert (target / "bin" / command).is_file()
    search = [sys.executable, str(target / "bin" / "vitplast-search"), "--space", "component_subsets"]
    search += ["--num-samples", "1", "--max-steps", "2", "--eval-every", "2", "--no-plasticity", "--quiet"]
    search += ["--storage", str(tmp_path / "results"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    out = subprocess.run(search, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Search component_subsets" in out.stdout and "1 trials" in out.stdout
    (record,) = (tmp_path / "results").glob("*/vitplast_search.json")
    assert Path(json.loads(record.read_text())["space_path"]).is_relative_to(target)  # the wheel's space file


def test_every_subpackage_is_one_the_wheel_ships():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "vitplast_tune").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_the_hf_extra_names_transformers():
    assert any(r.startswith("transformers>=5") for r in PYPROJECT["project"]["optional-dependencies"]["hf"])
