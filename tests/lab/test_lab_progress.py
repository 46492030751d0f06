"""Where a registered run stands (lab/progress.py), from a planted storage folder: its events, each lab's finished
stages and the trials ended in the stage running, written between a page's markers and nowhere else."""

from __future__ import annotations

import json

import pytest

from vitplast_tune.errors import UserError
from vitplast_tune.lab import progress


def test_progress_reads_the_storage_and_fills_the_pages_block(tmp_path):
    storage = tmp_path / "labs"
    lab = storage / "lab.s0.digits"
    (lab / "single" / "trial_a").mkdir(parents=True)
    (lab / "single" / "trial_b").mkdir()
    (lab / "single" / "trial_a" / "result.json").write_text('{"step": 50}\n{"step": 150, "test_acc": 0.9}\n')
    (lab / "single" / "trial_b" / "result.json").write_text('{"step": 50}\n')
    stages = {"full": {"trials": 15, "seconds": 600.0}, "full.ext1.lr0.03": {"trials": 5, "seconds": 300.0}}
    (lab / "lab.json").write_text(json.dumps({"stages": stages}))
    events = [{"event": "started", "at": "T1"}, {"event": "checked", "at": "T2", "lab": "lab.s1.x", "qualifies": False}]
    (storage / "registered.json").write_text(
        json.dumps({"preregistration": "p.yaml", "sha256": "ab" * 32, "events": events})
    )
    text = progress.progress_markdown(storage, now="NOW")
    assert text.startswith("Read at NOW UTC. Run of `p.yaml` (SHA-256 `abababababab`)")
    assert "| T2 | checked | lab.s1.x | no |" in text
    assert "| lab.s0.digits | running |  | 2 | 20 | 15.0 | single (1 trials ended) |" in text
    assert str(tmp_path) not in text
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\n{progress.BEGIN}\nold\n{progress.END}\n\nAfter.\n")
    progress.write_into_page(page, text)
    assert page.read_text() == f"# Title\n\n{progress.BEGIN}\n{text}{progress.END}\n\nAfter.\n"
    page.write_text("no markers\n")
    with pytest.raises(UserError, match="needs the lines"):
        progress.write_into_page(page, text)
    assert page.read_text() == "no markers\n"
