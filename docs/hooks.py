"""MkDocs hooks: the command-line reference made from trajflow's own parser."""
import argparse

MARKER = "<!-- trajflow-cli-reference -->"


def _help(parser):
    formatter = argparse.HelpFormatter  # a fixed width, not the terminal's
    parser.formatter_class = lambda prog: formatter(prog, width=96, max_help_position=30)
    return parser.format_help()


def cli_reference():
    from trajflow.workflows.cli.parser import build_parser
    parser = build_parser()
    parts = ["## trajflow", "", "```text", _help(parser).rstrip(), "```", ""]
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        parts += [f"## trajflow {name}", "", "```text", _help(sub).rstrip(), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_reference())
    return markdown




API_MARKER = "<!-- trajflow-api-reference -->"


def _entry(title, obj):
    """One name: its signature and its docstring as written (numpy style, examples
    included), preformatted."""
    import inspect
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError):
        signature = ""
    doc = inspect.cleandoc(obj.__doc__ or "(no docstring)")
    return [f"### `{title}{signature}`", "", "```text", doc, "```", ""]


def api_reference():
    """Every public name of `trajflow`, and the public methods and properties of its
    classes, from the code itself."""
    import inspect
    import trajflow
    parts = []
    for name in trajflow.__all__[1:]:
        obj = getattr(trajflow, name)
        parts += _entry(f"trajflow.{name}", obj)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in vars(obj).items():
                if member.startswith("_") or not (callable(value) or isinstance(value, property)):
                    continue
                target = value.fget if isinstance(value, property) else value
                parts += _entry(f"{name}.{member}", target)
    return "\n".join(parts)

