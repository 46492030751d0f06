"""Figures held to the data: the lab's results page and the README's quoted verdict, generated again from the kept
records by the script the docs name (scripts/lab_results_page.py), must be what is committed, to the character."""

from __future__ import annotations

import re

NUMBER = re.compile(r"[-+]?\d+\.\d+|[-+]?\d+")


def same_to_the_printed_digit(a: str, b: str) -> bool:
    """Two printouts the same but for numbers that differ by at most one unit of their last printed digit (and the
    same words around them)."""
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        return False
    for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
        digits = max(len(x.split(".")[1]) if "." in x else 0, len(y.split(".")[1]) if "." in y else 0)
        if abs(float(x) - float(y)) > 10.0**-digits + 1e-12:
            return False
    return True


def judged_and_said(text: str) -> str:
    """A pooled printout's family (every claim's figures, p-values and decision) and its sentences."""
    family = text.split("The pre-registered family, pooled")[1].split("\nHeadline:")[0]
    return family + text.split("What it says (generated from the figures above):")[1].split("\nfiles:")[0]
