#!/usr/bin/env python
"""Write the lab's results pages, their forest plots and the README's quoted verdict from the kept records: the
pre-registered verdict over the labs of lab-v2 (``vitplast_tune.lab.verdict_page``) and the first kept labs
re-analysed (``vitplast_tune.lab.page``); ``tests/lab/test_results_page.py`` generates them again and compares."""

from pathlib import Path

from vitplast_tune.lab import page, verdict_page

if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    print(verdict_page.write_page(root))
    print(page.write_page(root))
