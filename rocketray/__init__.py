"""rocketray: Apache RocketMQ's controller-mode high availability, re-implemented on Ray actors.

Every part installs under this one name: the source folders ``controller/``, ``broker/``, ``ha/``,
``snapshot/``, ``actors/``, ``spark_on_ray/``, ``verify/``, ``chaos/`` and ``cli/`` are the
subpackages ``rocketray.controller``, ``rocketray.broker``, ... (setuptools ``package-dir``).
"""

from __future__ import annotations

import os as _os

__version__ = "0.2.0"

# Run from a source checkout (no install, or a script such as driver.py run from the repository
# root, which puts this folder ahead of an installed copy on sys.path): the subpackages are the
# checkout's top-level folders, one level up. An installed wheel has them beside this file.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if (not _os.path.isdir(_os.path.join(_here, "controller"))
        and _os.path.isfile(_os.path.join(_root, "pyproject.toml"))
        and _os.path.isdir(_os.path.join(_root, "controller"))):
    __path__.append(_root)  # type: ignore[name-defined]  # noqa: F821
