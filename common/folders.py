"""seqrec's folders: each kind (a prepared dataset, a retriever artifact, a ranker) describes itself in a
manifest.json whose ``format`` names it. The package that writes a kind registers it here (`register_folder_kind`),
so messages about a folder given in the wrong place can say what it is, and commands can refuse an output folder
that already holds one, without this module knowing any package's formats."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import SeqrecError

MANIFEST = "manifest.json"  # what a dataset, an artifact or a ranker folder describes itself in
UNREADABLE = object()  # a manifest.json that is there but cannot be read or parsed


@dataclass(frozen=True)
class FolderKind:
    description: str  # for messages: "a prepared dataset written by `seqrec prepare`"
    replaced_by: str | None = None  # the command that replaces such a folder as a whole, if any: no output inside it


# format name (before the version: "seqrec.prepared") -> its kind; filled by the packages that write the folders
FOLDER_KINDS: dict[str, FolderKind] = {}


def register_folder_kind(format_name: str, description: str, *, replaced_by: str | None = None) -> None:
    """Declare a kind of folder seqrec writes, by its manifest's format name (``seqrec.ranker``)."""
    FOLDER_KINDS[format_name] = FolderKind(description, replaced_by)


def _registered(manifest: object) -> FolderKind | None:
    found = manifest.get("format") if isinstance(manifest, dict) else None
    return FOLDER_KINDS.get(found.split("/")[0]) if isinstance(found, str) else None


def manifest_kind(manifest: object) -> str | None:
    """What folder a parsed manifest.json describes (`FOLDER_KINDS`), None when it is no seqrec format."""
    kind = _registered(manifest)
    return None if kind is None else kind.description


def wrong_manifest(expected: str, manifest: object) -> str:
    """``not a EXPECTED manifest``, saying what the folder is when its manifest is another seqrec format."""
    kind = manifest_kind(manifest)
    if kind is None or not isinstance(manifest, dict):
        return f"not a {expected} manifest"
    return f"not a {expected} manifest (it is {manifest['format']}: {kind})"


def check_replaceable(out: Path, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse a ``replace_dir`` target that is a file, or a folder holding files that ``ours`` does not
    recognise as an earlier output of the same command (a dataset, a bundle: a typo must not delete them), or,
    where its manifest.json lists the files it wrote (``sha256``), any other entry: a model trained into a
    dataset's folder went without a word when `seqrec prepare --overwrite` replaced the folder."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SeqrecError(f"{out}: a file, where {what} is to be written")
    if any(out.iterdir()) and not ours(out):
        raise SeqrecError(f"{out}: holds files that are not {what}, and the output replaces the folder as a "
                          "whole; choose a new or empty folder")
    foreign = _unlisted_entries(out)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise SeqrecError(f"{out}: holds {out / foreign[0]}{more}, which {what} does not write, and the output "
                          "replaces the folder as a whole; move it out first, or choose a new folder")


def _unlisted_entries(folder: Path) -> list[str]:
    """The names in ``folder`` that neither are its manifest.json nor appear in the manifest's ``sha256`` (the
    files it wrote); none when the manifest lists no files."""
    manifest = _manifest(folder)
    listed = manifest.get("sha256") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict):
        return []
    ours = {MANIFEST, *(Path(name).parts[0] for name in listed if Path(name).parts)}
    return sorted(entry.name for entry in folder.iterdir() if entry.name not in ours)


def _manifest(folder: Path) -> object:
    """FOLDER/manifest.json parsed; None when there is none, UNREADABLE when it cannot be read or parsed."""
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return UNREADABLE


def folder_kind(folder: Path) -> str | None:
    """What FOLDER/manifest.json says the folder is (`manifest_kind`), "a manifest.json" for another one, None
    without one: for refusing an output folder that already holds a dataset or a bundle."""
    manifest = _manifest(folder)
    if manifest is None:
        return None
    return manifest_kind(manifest) or "a manifest.json"


def enclosing_seqrec_folder(path: Path) -> tuple[Path, str] | None:
    """The nearest folder above ``path`` (links resolved) whose manifest.json is one of seqrec's, with what it is
    (`manifest_kind`). None when none is."""
    for folder in path.resolve().parents:
        kind = manifest_kind(_manifest(folder))
        if kind is not None:
            return folder, kind
    return None


def refuse_seqrec_folder(out: Path, flag: str = "--out") -> None:
    """An output folder that holds a dataset, an artifact or a ranker of seqrec's is a mistake: refuse it. So is
    one inside a folder that a command replaces as a whole (a prepared dataset: `seqrec prepare --overwrite`)."""
    held = folder_kind(out) if out.is_dir() else None
    if held is not None:
        raise SeqrecError(f"{out} already holds {held}; choose a new {flag}")
    for folder in out.resolve().parents:
        kind = _registered(_manifest(folder))
        if kind is not None and kind.replaced_by is not None:
            raise SeqrecError(f"{out} is inside {folder}, {kind.description} ({kind.replaced_by} replaces that folder "
                              f"as a whole); choose a {flag} outside it")
