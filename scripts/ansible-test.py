"""ansible-test with Debian's checkers instead of PyPI's.

ansible-test (2.14) runs each sanity test in a virtual environment of its own
and pip-installs pinned checkers (pylint, pycodestyle, yamllint, voluptuous,
...) into it from PyPI. The hosts vmfork is built and tested on reach Debian's
archive but not PyPI, so the checkers come from Debian's packages
(scripts/deps.sh installs them): the environments are made with the system's
site packages and nothing is pip-installed into them. Everything else is
ansible-test's own code, configuration and test selection, unchanged.

Usage: python3 scripts/ansible-test.py sanity|units [ansible-test options]
"""

import sys

# pylint: disable=import-error,wrong-import-position
from ansible_test._internal import venv as _venv
from ansible_test._internal.commands import sanity as _sanity

_create = _venv.create_virtual_environment


def _create_with_site_packages(args, python, path, system_site_packages=False, pip=False):
    """create_virtual_environment, always with the system's site packages."""
    del system_site_packages
    return _create(args, python, path, True, pip)


def _no_pip(*args, **kwargs):
    """The requirements are Debian's packages already on the system."""
    del args, kwargs


_sanity.create_virtual_environment = _create_with_site_packages
_sanity.run_pip = _no_pip

from ansible_test._internal import main  # noqa: E402

sys.argv[0] = 'ansible-test'
main()
