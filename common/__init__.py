"""seqrec's shared plumbing: the error root, atomic writes, the installed version and small utilities that every
package may import. It imports nothing of seqrec's other packages."""

from importlib.metadata import PackageNotFoundError, version


def seqrec_version() -> str:
    """The installed seqrec's version (pyproject.toml): `seqrec --version` and the service's OpenAPI document."""
    try:
        return version("seqrec")
    except PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown"
