"""The test harness itself: CI's strict skips, and every test's isolation from the machine."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a fresh pytest in a child process per case

TESTS = Path(__file__).resolve().parent


def run_pytest(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    """Run one test file with this suite's conftest in a fresh pytest."""
    for name in ("conftest.py", "_spaces.py", "_costs.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_probe.py").write_text(body)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_probe.py"]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)


def test_a_skip_fails_when_skips_are_strict(tmp_path):
    """One fresh pytest, two skips: the conftest reads VITPLAST_STRICT_SKIPS as each test's report is made."""
    body = (
        "import pytest\n\n"
        "def test_strict(monkeypatch):\n    monkeypatch.setenv('VITPLAST_STRICT_SKIPS', '1')\n    pytest.skip('no browser')\n\n"
        "def test_lenient(monkeypatch):\n    monkeypatch.setenv('VITPLAST_STRICT_SKIPS', '0')\n    pytest.skip('no port')\n"
    )
    out = run_pytest(tmp_path, body)
    assert out.returncode == 1 and "1 failed, 1 skipped" in out.stdout, out.stdout
    assert "FAILED test_probe.py::test_strict" in out.stdout and "no browser" in out.stdout


def test_each_test_has_its_own_cache_results_cwd_and_ray_temp_dir_and_no_inherited_mlflow_target(tmp_path):
    """And one compute thread, and no MLflow tracking URI pinned by the test before it."""
    body = (
        "import os\nfrom pathlib import Path\n\n"
        "def test_a(tmp_path):\n"
        "    for key in ('VITPLAST_CACHE_DIR', 'VITPLAST_RESULTS_DIR'):\n"
        "        assert Path(os.environ[key]).is_relative_to(tmp_path)\n"
        "    assert Path.cwd() == tmp_path and 'RAY_ADDRESS' not in os.environ\n"
        "    assert not {'MLFLOW_TRACKING_URI', 'MLFLOW_EXPERIMENT_NAME', 'MLFLOW_EXPERIMENT_ID'} & set(os.environ)\n"
        "    assert os.environ['RAY_TMPDIR'] != os.environ.get('OUTER_RAY_TMPDIR')\n"
        "    Path('written').write_text('x')\n"
        "    import mlflow\n"
        "    mlflow.set_tracking_uri('sqlite:///pinned.db')\n\n"
        "def test_b():\n"
        "    import mlflow, torch\n"
        "    assert not Path('written').exists()\n"
        "    assert 'pinned' not in mlflow.get_tracking_uri()  # a URI the last test pinned is gone\n"
        "    assert os.environ['OMP_NUM_THREADS'] == '1' and torch.get_num_threads() == 1\n"
    )
    env = {"RAY_ADDRESS": "10.0.0.1:6379", "OUTER_RAY_TMPDIR": os.environ["RAY_TMPDIR"]}
    env |= {"MLFLOW_TRACKING_URI": "http://10.0.0.1:5000", "MLFLOW_EXPERIMENT_NAME": "x", "MLFLOW_EXPERIMENT_ID": "7"}
    out = run_pytest(tmp_path, body, **env)
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout + out.stderr
