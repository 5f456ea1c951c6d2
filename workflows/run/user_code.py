"""The user's own modules travel with the analysis to the tasks.

A scientist keeps an analysis in `rgyr.py` beside the script and writes
`from rgyr import rgyr`. The tasks' Python cannot import `rgyr` (the script's
folder is not on its path), and cloudpickle pickles the functions and classes
of an importable module by reference. So:

- a callable handed over by a script is pickled with every module of the
  user's own (loaded, and not installed: see `users_own`) registered to
  travel by value (`cloudpickle.register_pickle_by_value`);
- a factory file (`FILE.py:NAME`) is loaded with its folder on the path, as the
  tasks load their copy of it; the modules of the user's own it imports from
  that folder are copied beside the copy (RUNDIR/analysis/).

Whether that was enough is not assumed: the local trial (local_trial.py) loads
the analysis in a fresh Python that has none of the user's folders on its path.
"""
import contextlib
import functools
import importlib.metadata
import os
import shutil
import site
import sys
import sysconfig


@functools.lru_cache(maxsize=1)
def _installed_roots():
    """Folders whose modules are installed (the standard library, site-packages)."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    roots.update({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


@functools.lru_cache(maxsize=1)
def _installed_names():
    """Top-level import names of every installed distribution (an editable install of
    MDAnalysis or of the user's own package included: installed, it is there for the
    tasks too, and its classes must stay the same classes)."""
    return frozenset(importlib.metadata.packages_distributions())


def users_own(module) -> bool:
    """Whether `module` is the user's own: a file not under an installed location, of
    no installed distribution (trajflow's own editable install is one)."""
    name = getattr(module, "__name__", "") or ""
    path = getattr(module, "__file__", None)
    return isinstance(name, str) and isinstance(path, str) and _users_own(name, path)


@functools.lru_cache(maxsize=None)
def _users_own(name, path):
    """users_own by a module's name and file, once each: every Backend run asks it of
    each of the thousands of loaded modules (0.06 s a run when each path was resolved)."""
    top = name.partition(".")[0]
    if not path or name == "__main__" or top == "trajflow" or top in _installed_names():
        return False
    return not os.path.realpath(path).startswith(_installed_roots())


def users_modules(names=None):
    """The loaded modules (of `names`, default all) that are the user's own."""
    names = list(sys.modules) if names is None else names
    return [sys.modules[n] for n in names if n in sys.modules and users_own(sys.modules[n])]


@contextlib.contextmanager
def pickled_by_value(modules):
    """Inside: cloudpickle pickles the functions and classes of `modules` by value."""
    import cloudpickle
    registered = []
    try:
        for module in modules:
            try:
                cloudpickle.register_pickle_by_value(module)
                registered.append(module)
            except ValueError:  # already registered, or not in sys.modules
                pass
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def pickle_callable(factory) -> bytes:
    """The callable and every piece of the user's own code it needs, by value."""
    import cloudpickle
    with pickled_by_value(users_modules()):
        return cloudpickle.dumps(factory)


def modules_beside(factory_file):
    """{name in RUNDIR/analysis/: source} of the user's own modules loaded from the
    factory file's folder (a module file, or a package's whole folder of .py files),
    to copy beside the factory's copy."""
    folder = os.path.realpath(os.path.dirname(factory_file)) + os.sep
    found = {}
    for module in users_modules():
        path = os.path.realpath(module.__file__)
        if not path.startswith(folder) or path == os.path.realpath(factory_file):
            continue
        top = path[len(folder):].split(os.sep)[0]
        # imported from this folder as `top` (rgyr.py, or the package rgyr/), not a module
        # that merely lives somewhere below it
        if module.__name__.partition(".")[0] == os.path.splitext(top)[0]:
            found[top] = folder + top
    return dict(sorted(found.items()))


def copy_modules(modules, dest):
    """Copy modules_beside()'s modules into `dest` (packages: their .py files only)."""
    for name, source in modules.items():
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(dest, name), dirs_exist_ok=True,
                            ignore=lambda d, names: [n for n in names if not (
                                n.endswith(".py") or os.path.isdir(os.path.join(d, n)))
                                or n == "__pycache__"])
        else:
            shutil.copyfile(source, os.path.join(dest, name))
