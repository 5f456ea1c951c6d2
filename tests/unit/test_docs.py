"""The documentation's code: every Python block in the README and docs/ compiles, every
`trajflow COMMAND` it shows is a command, every option it shows is one of that
command's, and the pages MkDocs builds are the ones its navigation lists."""
import ast
import glob
import os
import re

import pytest

from paths import TESTS

ROOT = os.path.dirname(TESTS)
PAGES = [os.path.join(ROOT, "README.md")] + sorted(
    glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def blocks(path, language):
    text = open(path, encoding="utf-8").read()
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_python_block_compiles(path):
    for code in blocks(path, "python"):
        if code.lstrip().startswith("--8<--"):  # a file included when the site is built
            continue
        ast.parse(code)  # a SyntaxError names the page and the line


def shown_commands(path):
    """(command, words after it) of every `trajflow ...` line of the page's shell blocks,
    comments left out."""
    for code in blocks(path, "bash"):
        for line in code.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0]
            match = re.search(r"(?:^|[\s/])trajflow\s+(.*)", line)
            if match:
                words = match.group(1).split()
                yield words[0], words[1:]


def test_every_command_and_option_shown_exists():
    import argparse
    from trajflow.workflows.cli.parser import build_parser
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    top = {s for a in parser._actions for s in a.option_strings}
    for path in PAGES:
        for command, words in shown_commands(path):
            if command.startswith("-"):
                assert command in top, f"{path}: `trajflow {command}`: no such option"
                continue
            assert command in commands, f"{path}: `trajflow {command}` is not a command"
            sub = commands[command]
            nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
            if nested:  # `trajflow pilot start ...`: the options of the command's command
                assert words and words[0] in nested[0].choices, \
                    f"{path}: `trajflow {command} {' '.join(words[:1])}` is not a command"
                sub, words = nested[0].choices[words[0]], words[1:]
            known = {s for a in sub._actions for s in a.option_strings}
            for word in words:
                if word in ("|", "&&", ";"):
                    break
                if word.startswith("--"):
                    assert word.split("=")[0] in known, \
                        f"{path}: `trajflow {command} {word}`: no such option"


def test_the_navigation_lists_every_page():
    import yaml
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as fh:
        nav = yaml.safe_load(fh)["nav"]

    def files(entries):
        for entry in entries:
            for value in entry.values():
                yield from files(value) if isinstance(value, list) else [value]
    listed = set(files(nav))
    pages = {os.path.relpath(p, os.path.join(ROOT, "docs")) for p in PAGES[1:]}
    assert listed == pages, (sorted(pages - listed), sorted(listed - pages))


def test_every_parallelisable_class_says_how_its_results_combine():
    """The guide's table names every class the installed MDAnalysis declares parallelisable
    (each row says how its pieces combine and what file it is tested on)."""
    from trajflow.tasks.mda_analyses import NOT_IMPORTED, parallelisable_classes
    text = open(os.path.join(ROOT, "docs", "guide", "own-analysis.md"), encoding="utf-8").read()
    table = text[text.index("## How each analysis' results combine"):]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| ")]
    named = {name.strip(" `") for row in rows for name in re.split(r",\s*", row)}
    missing = set(parallelisable_classes()) - named
    assert not missing, f"docs/guide/own-analysis.md's table lacks {sorted(missing)}"
    assert not NOT_IMPORTED, f"analyses the test environment cannot import: {NOT_IMPORTED}"


def test_the_chunk_default_is_the_same_in_help_and_guide():
    """`--chunk 0`'s size, from the one constant, in `trajflow run --help` and the guide
    (the help once said 8 MiB of a 1 MiB default)."""
    from trajflow.tasks.plan import CHUNK_BYTES
    from trajflow.workflows.run.spec import RunSpec
    size = f"{CHUNK_BYTES >> 20} MiB of coordinates"
    help_text = RunSpec.__dataclass_fields__["chunk"].metadata["help"]
    guide = open(os.path.join(ROOT, "docs", "guide", "cli.md"), encoding="utf-8").read()
    row = next(line for line in guide.splitlines() if line.startswith("| `--chunk F`"))
    assert size in help_text and size in row, (help_text, row)


def test_the_example_notebook_names_the_extra_that_brings_its_data():
    """After `pip install trajflow` the notebook failed on MDAnalysisTests, which the wheel
    does not require: it names the extra that brings it, and setup.cfg's extra does."""
    import configparser
    import json
    notebook = json.load(open(os.path.join(ROOT, "examples", "trajflow.ipynb"), encoding="utf-8"))
    text = "".join("".join(cell["source"]) for cell in notebook["cells"])
    imports = re.findall(r"^\s*(?:from|import) (\w+)", text, re.M)
    extra = re.search(r"pip install 'trajflow\[(\w+)\]'", text).group(1)
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    brings = cfg["options.extras_require"][extra]
    required = cfg["options"]["install_requires"]
    for module in set(imports) - {"trajflow"}:
        assert module in brings or module.lower() in required.lower(), module


def test_the_readme_says_what_matters_and_leaves_the_rest_to_the_docs():
    """The README once ran to 217 lines (the fault table, the virtual cluster, the test
    layers in full); those live in the docs, and the README points there."""
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()
    assert len(lines) <= 160, len(lines)
    reliability = open(os.path.join(ROOT, "docs", "guide", "reliability.md"),
                       encoding="utf-8").read()
    assert "| SIGSTOP of one MPI rank" in reliability  # the fault table, whole, in the guide
