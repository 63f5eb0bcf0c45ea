"""Packaging that pyproject.toml cannot say: configs/ ships inside the wheel as offline/configs, so an installed
seqrec (pip, the Docker image) finds the pipeline configs `seqrec demo` runs and the retriever configs they name."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["common*", "retriever*", "ranker*", "service*", "offline*"]), "offline.configs"],
    package_dir={"offline.configs": "configs"},
    package_data={"service.http": ["static/*"], "offline.configs": ["**/*.yaml"]},  # static: the try-it page at /
)
