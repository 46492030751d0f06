"""The public face's docstrings as the anchors (Optuna) write them: a first line that is a sentence saying what, then
Google-style sections (``Args:`` naming every parameter, ``Returns:`` or ``Yields:`` when something comes back), every
parameter and return annotated. The API reference (mkdocstrings, docstring_style google) renders these sections."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re

# Every face: each package's ``__all__`` and the root's (the ``vitplast`` command's cli has none).
FACES = (
    "vitplast_tune.data",
    "vitplast_tune.space",
    "vitplast_tune.predictors",
    "vitplast_tune.vit",
    "vitplast_tune.workflows",
    "vitplast_tune.lab",
    "vitplast_tune.recommend",
    "vitplast_tune.plan",
    "vitplast_tune.records",
    "vitplast_tune.run",
    "vitplast_tune.analysis",
    "vitplast_tune",
)
# Modules checked whole (every public function and class defined in them, exported or not): only those whose every
# public name is the user's API. log is rendered whole in the API reference (docs/reference/api.md). The other root
# modules (components, freezing, config, type_checks, storage, errors, ...) hold the package's internal helpers: their
# exported names are checked through the faces above, and an internal helper's docstring is one plain sentence.
MODULES = ("vitplast_tune.log",)

_SECTION = re.compile(r"^(\w[\w ]*):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)(?: \([^)]*\))?:")


def sections(doc: str) -> dict[str, list[str]]:
    """The Google-style sections of a docstring: each title mapped to the names its entries start with."""
    found: dict[str, list[str]] = {}
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        match = _SECTION.match(line)
        if not match or (i and lines[i - 1].strip()):  # a title stands at the margin after a blank line
            continue
        names = found.setdefault(match.group(1), [])
        for entry in lines[i + 1 :]:
            if entry.strip() and not entry.startswith(" "):
                break
            if entry.startswith("    ") and not entry.startswith("     ") and (hit := _ENTRY.match(entry[4:])):
                names.append(hit.group(1).lstrip("*"))
    return found


def _returns_something(annotation: object) -> bool:
    return annotation not in (None, "None", "NoReturn", "Never")


def function_problems(name: str, fn: object, *, skip_first: bool = False, inherited: bool = False) -> list[str]:
    """What keeps a function's docstring from the anchors' style (nothing: it follows it); an ``inherited`` one (an
    override of another project's method) needs no sections: they are the base's."""
    doc = inspect.getdoc(fn) or ""
    if not doc:
        return [f"{name}: no docstring"]
    problems = [] if doc.splitlines()[0].rstrip().endswith(".") else [f"{name}: first line is not a sentence"]
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1 if skip_first else 0 :]
    found = sections(doc)
    missing = [] if inherited else [p.name for p in params if p.name not in found.get("Args", [])]
    if missing:
        problems.append(f"{name}: Args does not name {missing}")
    unannotated = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if unannotated:
        problems.append(f"{name}: parameters not annotated {unannotated}")
    if signature.return_annotation is inspect.Signature.empty:
        problems.append(f"{name}: return not annotated")
    elif _returns_something(signature.return_annotation) and not ({"Returns", "Yields"} & set(found) or inherited):
        problems.append(f"{name}: no Returns section")
    return problems


def class_problems(name: str, cls: type) -> list[str]:
    """What keeps a class's docstring and its public methods' from the anchors' style."""
    doc = inspect.getdoc(cls) or ""
    if not doc or cls.__doc__ is None:
        return [f"{name}: no docstring"]
    problems = [] if doc.splitlines()[0].rstrip().endswith(".") else [f"{name}: first line is not a sentence"]
    found = sections(doc)
    if dataclasses.is_dataclass(cls):
        own = inspect.get_annotations(cls)  # fields a base class declares are documented there
        fields = [f.name for f in dataclasses.fields(cls) if f.init and f.name in own]
        missing = [f for f in fields if f not in found.get("Attributes", [])]
        if missing:
            problems.append(f"{name}: Attributes does not name {missing}")
    elif "__init__" in vars(cls):
        params = list(inspect.signature(cls.__init__).parameters)[1:]
        missing = [p for p in params if p not in found.get("Args", [])]
        if missing:
            problems.append(f"{name}: Args does not name {missing}")
    for attr, member in vars(cls).items():
        if attr.startswith("_") or isinstance(member, property):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            problems += function_problems(f"{name}.{attr}", member.__func__, skip_first=isinstance(member, classmethod))
        elif inspect.isfunction(member):
            hook = _overrides_another_projects(cls, attr)  # Tune's callback hooks: their arguments documented there
            problems += function_problems(f"{name}.{attr}", member, skip_first=True, inherited=hook)
    return problems


def _overrides_another_projects(cls: type, attr: str) -> bool:
    """Whether ``cls.attr`` overrides a method a base class from another project defines."""
    return any(attr in vars(base) and not base.__module__.startswith("vitplast_tune") for base in cls.__mro__[1:-1])


def public_objects() -> list[tuple[str, object]]:
    """Every function and class of the faces (their ``__all__``) and of the root modules above, by qualified name."""
    found = []
    for face in FACES:
        module = importlib.import_module(face)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if callable(obj):
                found.append((f"{obj.__module__}.{attr}", obj))
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            public = not attr.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
            if public and obj.__module__ == name:
                found.append((f"{name}.{attr}", obj))
    return found


def problems_of(objects: list[tuple[str, object]]) -> list[str]:
    """Every problem of these functions' and classes' docstrings."""
    problems = []
    for name, obj in objects:
        problems += class_problems(name, obj) if inspect.isclass(obj) else function_problems(name, obj)
    return problems


def test_the_face_is_documented_in_the_anchors_style():
    objects = public_objects()
    assert all(any(name.startswith(f"{where}.") for name, _ in objects) for where in FACES + MODULES)
    assert problems_of(objects) == []


def test_the_check_sees_each_kind_of_fault():
    def good(x: int, *, y: str = "") -> int:
        """Add one.

        Args:
            x: A number.
            y: A label.

        Returns:
            The number plus one.
        """
        return x + 1

    def bad(x, y: str) -> int:
        """the number plus one; a noun phrase
        running on.

        Args:
            x: A number.
        """
        return x + 1

    assert function_problems("good", good) == []
    assert function_problems("bad", bad) == [
        "bad: first line is not a sentence",
        "bad: Args does not name ['y']",
        "bad: parameters not annotated ['x']",
        "bad: no Returns section",
    ]

    @dataclasses.dataclass
    class Point:
        """A point.

        Attributes:
            x: Across.
        """

        x: int
        y: int

    assert class_problems("Point", Point) == ["Point: Attributes does not name ['y']"]
