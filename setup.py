"""Package discovery for the three mapped folders (the rest of the metadata is in pyproject.toml).

``omni_stream/`` installs as itself; ``realtime/`` and ``codecs/`` install under it (``package-dir`` in
pyproject.toml). setuptools' automatic discovery does not follow such a mapping, so each folder's packages are found
here with ``find_packages`` and prefixed with the name they install under: a new subpackage needs no edit anywhere.
"""

from setuptools import find_packages, setup

MAPPED = {"omni_stream": "omni_stream", "omni_stream.realtime": "realtime", "omni_stream.codecs": "codecs"}


def packages() -> list[str]:
    found: list[str] = []
    for name, folder in MAPPED.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(packages=packages())
