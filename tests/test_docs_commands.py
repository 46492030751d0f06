"""Every ``vitplast`` command the documentation shows is a command the package takes: each one written in the README
and the docs' pages (code blocks and inline code; ``python -m vitplast_tune ...`` and ``python scripts/search.py ...``
too) is parsed by the command's own parser, and a search's flags are made into its ``SearchOptions``, so an unknown
flag, a bad value or an unknown ``--set`` setting fails here; every ``--flag`` named alone in the pages is a flag of
some command. The dated pages under docs/results/ record runs as they were made and are left as written. The
README's quickstart and its next steps are run for real by tests/test_readme.py, the notebook by test_notebook.py."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from vitplast_tune import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs").glob("[!r]*/*.md")])
COMMAND = re.compile(  # a command at the start of a shell line or inline span (a venv's path before it allowed)
    r"(?:[A-Z_]+=\S+\s+)*(?:\S*/)?(?:vitplast(?:-[a-z]+)?|python -m vitplast_tune|python scripts/search\.py)(?:\s.*)?$"
)
SUBMITTED = re.compile(r"ray submit \S+ scripts/search\.py -- (.*)$")  # the search a cluster launcher runs
ALIASES = {f"vitplast-{name}": name for name in cli.COMMANDS}
PLACEHOLDERS = {"...", "COMMAND"}
SLURM_FLAGS = {"--account", "--gres", "--mem", "--partition"}  # sbatch's, named in docs/cluster.md beside the script's
MLFLOW_FLAGS = {"--app-name"}  # `mlflow ui`'s own, named in docs/guide/mlflow.md for a team's server


def fenced_blocks(text: str) -> tuple[list[str], str]:
    """The shell code blocks of a page (``bash``, ``console``, ``sh`` or none), and the page without any block."""
    blocks, prose, inside, lang, lines = [], [], False, "", []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if inside:
                if lang in ("", "bash", "console", "sh", "shell"):
                    blocks.append("\n".join(lines))
                inside, lines = False, []
            else:
                inside, lang = True, line.strip()[3:].strip()
        elif inside:
            lines.append(line)
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def line_commands(line: str) -> list[str]:
    """The vitplast commands of one shell line: each part of a chain, and a command quoted for ssh or ray exec."""
    found = [c for quoted in re.findall(r"'([^']*)'", line) for c in line_commands(quoted)]
    for part in re.split(r"&&|;|\|", re.sub(r"'[^']*'", "", line)):
        part = part.strip().removeprefix("$ ")
        if m := SUBMITTED.match(part):
            found.append(f"python scripts/search.py {m.group(1)}")
        elif COMMAND.match(part):
            found.append(part)
    return found


def commands(text: str) -> list[tuple[str, bool]]:
    """Every vitplast command of a page, as written (continuations joined, comments and chains split off), and
    whether it is inline code (a command named in prose, which may end on a flag whose value the prose gives)."""
    blocks, prose = fenced_blocks(text)
    found = []
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            found += [(c, False) for c in line_commands(re.sub(r"(^|\s)#.*", "", line).strip())]
    for line in prose.splitlines():
        for inline in re.findall(r"(?<!`)`([^`]+)`(?!`)", line):
            if COMMAND.match(inline.strip()):
                found.append((inline.strip(), True))
    return found


def words_of(command: str) -> tuple[str, list[str]]:
    """The subcommand and its arguments (environment assignments, placeholders and redirections dropped)."""
    command = re.sub(r"\s\(.*\)$", "", command)  # "vitplast ui quickstart   (serves the view below)"
    words = [w for w in shlex.split(command) if not re.match(r"[A-Z_]+=", w)]
    cut = next((i for i, w in enumerate(words) if w in (">", ">>", "2>&1", "&") or w.startswith(">")), len(words))
    words = [w for w in words[:cut] if w not in PLACEHOLDERS or w == "..."]
    words[0] = words[0].rsplit("/", 1)[-1]  # .venv/bin/vitplast
    if words[:2] == ["python", "scripts/search.py"]:
        return "search", words[2:]
    if words[:3] == ["python", "-m", "vitplast_tune"]:
        words = ["vitplast", *words[3:]]
    if words[0] in ALIASES:
        return ALIASES[words[0]], words[1:]
    assert words[0] == "vitplast", command
    return (words[1] if len(words) > 1 else ""), words[2:]


def parse(name: str, args: list[str]) -> None:
    """Parse ``args`` with command ``name``'s own parser (a search's into its ``SearchOptions`` too); a mistake
    raises SystemExit (the parser's one line) or a UserError."""
    parser = cli._MODULES[name].parser()
    valued = [a.nargs != 0 for a in parser._actions]
    takes = {s: v for a, v in zip(parser._actions, valued) for s in a.option_strings}
    # "--model ... --dataset ...": "..." stands for a value after a flag that takes one, else for more flags
    args = ["VALUE" if w == "..." and takes.get(args[i - 1], False) else w for i, w in enumerate(args)]
    args = [w for w in args if w != "..."]
    if name == "search":
        from vitplast_tune.cli.search import options_of

        options_of(parser.parse_args(args))
    elif name == "lab":
        parser.parse_intermixed_args(args)
    else:
        parser.parse_args(args)


def written() -> list[tuple[str, str, bool]]:
    return [(str(p.relative_to(ROOT)), c, inline) for p in PAGES for c, inline in commands(p.read_text())]


def test_the_pages_show_commands_to_check():
    found = written()
    assert len(found) > 30 and {p for p, _, _ in found} >= {"README.md", "docs/cluster.md", "docs/guide/many-gpus.md"}


@pytest.mark.parametrize(("page", "command", "inline"), written())
def test_every_command_in_the_docs_is_taken_by_its_parser(page, command, inline):
    name, args = words_of(command)
    if not name or name in ("--help", "--version"):
        return  # `vitplast`, `vitplast --help`: the command itself
    assert name in cli.COMMANDS, f"{page}: {command}: no command {name!r}"
    if not args or args == ["--help"]:
        return  # `vitplast ui`, `vitplast search`: the command named in prose; --help prints and exits 0
    with contextlib.redirect_stderr(io.StringIO()) as said:
        try:
            parse(name, args)
        except SystemExit as exc:
            if inline and args[-1].startswith("--") and "expected" in said.getvalue():
                return  # `vitplast lab pooled --from` in prose: the flag named, its value in the sentence
            pytest.fail(f"{page}: `{command}` is refused: {said.getvalue().strip() or exc}")


def test_every_flag_the_pages_name_is_a_flag_of_a_command():
    flags = set()
    for module in cli._MODULES.values():
        flags |= {s for a in module.parser()._actions for s in a.option_strings}
    named = {}
    for page in PAGES:
        _, prose = fenced_blocks(page.read_text())
        for inline in re.findall(r"`(--[a-z][a-z0-9-]*)", prose):
            named.setdefault(inline, str(page.relative_to(ROOT)))
    # The other tools' flags the pages name: the benchmarks' (docs/benchmarks.md), the SLURM script's #SBATCH lines.
    flags |= set(
        re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)', "".join(p.read_text() for p in ROOT.glob("benchmarks/*.py")))
    )
    flags |= set(re.findall(r"^##?SBATCH (--[a-z-]+)", (ROOT / "scripts/cluster/slurm.sbatch").read_text(), re.M))
    unknown = {f: page for f, page in named.items() if f not in flags | SLURM_FLAGS | MLFLOW_FLAGS}
    assert len(named) > 20 and unknown == {}


EVERY_PAGE = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.ipynb"))]
RETIRED = re.compile(rf"\bvitplast-(?:{'|'.join(cli.COMMANDS)})\b")  # the older aliases: `vitplast COMMAND` is the name


def test_the_command_line_page_lists_every_subcommand():
    page = (ROOT / "docs" / "guide" / "command-line.md").read_text()
    assert [name for name in cli.COMMANDS if f"| `vitplast {name}` |" not in page] == []


def test_no_page_names_a_command_by_its_retired_alias():
    found = {str(p.relative_to(ROOT)): sorted(set(RETIRED.findall(p.read_text()))) for p in EVERY_PAGE}
    assert len(found) > 30 and {page: names for page, names in found.items() if names} == {}


def test_the_readmes_python_search_takes_a_name_of_its_own():
    """The README's ``vt.run_search(..., name=...)`` follows its main command, whose search already holds that name:
    the same name is refused ("search quickstart already exists")."""
    readme = (ROOT / "README.md").read_text()
    main = re.search(r"--name (\S+)", readme.split("## Quickstart", 1)[1]).group(1)
    names = re.findall(r'vt\.run_search\([^)`]*name="([^"]+)"', readme)
    assert names and main not in names
