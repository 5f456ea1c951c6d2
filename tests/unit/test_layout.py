"""The design card's layout, kept: tasks/ imports nothing from workflows/, and no
subpackage of workflows/ imports one that imports it back (read from the sources'
import lines, every function's own imports included)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def imported_modules(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def subpackage(module):
    """trajflow.workflows.run.pilot -> "run"; trajflow.tasks... -> "tasks"."""
    parts = module.split(".")
    if parts[:2] == ["trajflow", "tasks"]:
        return "tasks"
    if parts[:2] == ["trajflow", "workflows"] and len(parts) > 2:
        return parts[2]
    return None


def dependencies():
    deps = {}
    for path in list((ROOT / "workflows").rglob("*.py")) + list((ROOT / "tasks").rglob("*.py")):
        rel = path.relative_to(ROOT).parts
        mine = "tasks" if rel[0] == "tasks" else (rel[1] if len(rel) > 2 else None)
        if mine is None:
            continue
        for module in imported_modules(path):
            other = subpackage(module)
            if other and other != mine and other != "errors":
                deps.setdefault(mine, {}).setdefault(other, set()).add(str(path.relative_to(ROOT)))
    return deps


def test_tasks_import_nothing_from_workflows():
    deps = dependencies()
    assert not {k: v for k, v in deps.get("tasks", {}).items() if k != "tasks"}, deps["tasks"]


def test_no_two_subpackages_import_each_other():
    deps = dependencies()
    assert {"run", "profile", "cli"} <= deps.keys() and "profile" in deps["run"]  # it reads
    cycles = [(a, b, sorted(deps[a][b]), sorted(deps[b][a])) for a in deps for b in deps[a]
              if a < b and a in deps.get(b, {})]
    assert cycles == []
