"""`trajflow run`'s options, made from RunSpec's and PilotSpec's fields.

A flag's name, help, choices and default come from the field; argparse keeps
no default of its own (an option not given is absent from the namespace), so
the spec's default is the only one, as in the API.
"""
import argparse
import dataclasses
import json

from trajflow.workflows.run.spec import RunSpec, element_type, spelled, value_type

RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunSpec))
RESUMED_OPTIONS = ("retries", "progress")  # a resumed run's own; the rest are its plan's


def _json_object(text):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({exc}); give a JSON object, "
                                         'e.g. \'{"nbins": 75}\'')
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object of names and values, "
                                         'e.g. \'{"nbins": 75}\'')
    return value


def add_spec_options(parser, spec, only=None):
    """One flag per field of `spec` (RunSpec or PilotSpec) shown on the command line
    (`only`: just these fields)."""
    for f in dataclasses.fields(spec):
        meta = f.metadata
        if not meta["command_line"] or (only is not None and f.name not in only):
            continue
        kind = value_type(f)
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        shown = "none" if f.default in (None, "") else f.default
        common = dict(dest=f.name, default=argparse.SUPPRESS)
        if kind is bool:  # a flag that turns the default around (--quiet: progress False)
            parser.add_argument(flag, action="store_false" if f.default else "store_true",
                                help=meta["flag_help"] or meta["help"], **common)
            continue
        if kind is list:
            common["nargs"] = "+"
            kind = element_type(f)
        elif kind is dict:
            kind = _json_object
        elif kind not in (int, float):
            kind = str
        parser.add_argument(flag, type=kind, choices=meta["choices"], metavar=meta["metavar"],
                            help=meta["help"] if meta["help"].endswith("required")
                            else f"{meta['help']} (default: {shown})", **common)


def spec_from_args(spec, args):
    """`spec` made from the options given on the command line (its defaults for the rest)."""
    names = {f.name for f in dataclasses.fields(spec)}
    return spec(**{k: v for k, v in vars(args).items() if k in names})


def flags_said(args, spec, only=None):
    """The flags of `spec` given on the command line, spelled as there."""
    names = [f.name for f in dataclasses.fields(spec) if only is None or f.name in only]
    return [spelled(n) for n in names if n in vars(args)]

