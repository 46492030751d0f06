#!/usr/bin/env python
"""Write the lab's dated results page, its forest plots and the README's quoted verdict from the kept records
(``vitplast_tune.lab.page``); ``tests/lab/test_results_page.py`` generates them again and compares."""

from pathlib import Path

from vitplast_tune.lab.page import write_page

if __name__ == "__main__":
    print(write_page(Path(__file__).resolve().parents[1]))
