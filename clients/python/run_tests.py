#!/usr/bin/env python3
"""Run the Python client's tests with pytest (what `make test-python` does).

pytest comes from Debian's python3-pytest: a pure-Python package that any
python3 of 3.10 or later can import once /usr/lib/python3/dist-packages is
on its path, put last so that this interpreter's own packages win. When it
is missing, this script installs it with apt-get (as root, or through
sudo), so that the project's own files install what the tests need; on
Python 3.10 also the two backports it needs there (Debian builds it for
3.11).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DEBIAN_PACKAGES = "/usr/lib/python3/dist-packages"
HERE = Path(__file__).resolve().parent
PACKAGES = ["python3-pytest"] + (["python3-exceptiongroup", "python3-tomli"]
                                 if sys.version_info < (3, 11) else [])


def import_pytest():
    if os.path.isdir(DEBIAN_PACKAGES) and DEBIAN_PACKAGES not in sys.path:
        sys.path.append(DEBIAN_PACKAGES)
    try:
        import pytest
        return pytest
    except ImportError as e:
        print(f"run_tests: cannot import pytest: {e}", flush=True)
        return None


def apt_install() -> None:
    apt = shutil.which("apt-get")
    if apt is None:
        sys.exit("pytest is missing and there is no apt-get to install python3-pytest; "
                 "install pytest for this python3")
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else [])
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = prefix + [apt, "install", "-y", "-q", *PACKAGES]
    print(f"run_tests: installing Debian's {' '.join(PACKAGES)}", flush=True)
    if subprocess.run(install, env=env).returncode != 0:
        subprocess.run(prefix + [apt, "update", "-q"], env=env)
        if subprocess.run(install, env=env).returncode != 0:
            sys.exit(f"run_tests: apt-get install {' '.join(PACKAGES)} failed")


def main() -> int:
    if sys.version_info < (3, 10):
        sys.exit(f"the berth client needs Python 3.10 or later, this is {sys.version.split()[0]}")
    sys.dont_write_bytecode = True  # leave no __pycache__ in the tree
    pytest = import_pytest()
    if pytest is None:
        apt_install()
        pytest = import_pytest()
        if pytest is None:
            sys.exit("run_tests: pytest still cannot be imported")
    print(f"run_tests: Python {sys.version.split()[0]}, pytest {pytest.__version__}", flush=True)
    args = ["-q", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=120",
            str(HERE / "tests"), *sys.argv[1:]]
    return pytest.main(args)


if __name__ == "__main__":
    sys.exit(main())
