"""The package list for setuptools: ``autopar`` and every package under its folders.

``pyproject.toml`` maps ``autopar.costmodel`` and ``autopar.passes`` to the top-level folders
``costmodel/`` and ``passes/`` (``package-dir``), which its
``packages.find`` form cannot follow; so the packages are found here, and a new one (a model
family's folder, ``autopar/models/<family>/``) goes into the wheel without being listed. Folders
without an ``__init__.py`` count (``autopar/core`` is a namespace package).
"""

from setuptools import find_namespace_packages, setup

FOLDERS = {"autopar": "autopar", "autopar.costmodel": "costmodel", "autopar.passes": "passes"}
"""Package -> its folder, as ``[tool.setuptools.package-dir]`` maps them."""


def packages() -> list[str]:
    """Every package under ``FOLDERS``, byte-code caches left out."""
    found = []
    for package, folder in FOLDERS.items():
        subs = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
        found += [package, *(f"{package}.{sub}" for sub in sorted(subs))]
    return found


setup(packages=packages())
