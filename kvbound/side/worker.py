"""The entry script of every worker that runs in a release's side venv.

``python -P kvbound/side/worker.py conform|trace``, with ``PYTHONPATH=<release tree>`` in
the deps venv, where kvbound is not installed: registers this directory as the side
package ``kvbound_side`` (its modules import each other relatively, here and as
``kvbound.side`` on the host), then serves conform's cases (``conform_worker``) or trace
jobs (``trace_worker``). Importing this file (a reproducer, a test driver) registers the
package and serves nothing.
"""

import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "kvbound_side"
ROLES = {"conform": "conform_worker", "trace": "trace_worker"}


def side_package():
    """This directory as the package ``kvbound_side`` (once per process)."""
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(PACKAGE, os.path.join(HERE, "__init__.py"),
                                                      submodule_search_locations=[HERE])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = pkg
        spec.loader.exec_module(pkg)
    return sys.modules[PACKAGE]


side_package()


def main(argv):
    if len(argv) != 2 or argv[1] not in ROLES:
        sys.stderr.write("usage: worker.py %s\n" % "|".join(ROLES))
        return 2
    return importlib.import_module(PACKAGE + "." + ROLES[argv[1]]).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
