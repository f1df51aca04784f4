"""The one thing pyproject.toml cannot say: which packages the card's folders become.

The repository keeps the product card's folders (``services/``, ``spark_client/``), but a user's
environment gets only the ``udfserve`` namespace: ``services/`` installs as ``udfserve.services`` and
``spark_client/`` as ``udfserve.spark_client``. A generic top-level ``services`` would collide with a
user's own package of that name (docs/architecture.md, "Packages and folders"). Everything else
about the build is in pyproject.toml.
"""

from setuptools import find_packages, setup

# folder in the repository -> the package it installs as
MAPPED_FOLDERS = {"services": "udfserve.services", "spark_client": "udfserve.spark_client"}


def _packages_of(folder: str, package: str) -> list[str]:
    return [package, *(f"{package}.{name}" for name in find_packages(where=folder))]


setup(
    packages=[
        *find_packages(include=["udfserve", "udfserve.*"]),
        *(name for folder, package in MAPPED_FOLDERS.items() for name in _packages_of(folder, package)),
    ],
    package_dir={"udfserve": "udfserve", **{package: folder for folder, package in MAPPED_FOLDERS.items()}},
)
