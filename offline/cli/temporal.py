"""The protocol flags that `seqrec prepare`, `train`, `evaluate`, `tune` and `pipeline` share: --protocol,
--valid-cut, --test-cut and, where a model is fitted and then refitted, --refit (docs/temporal.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import SeqrecError
from offline.data.protocols import DEFAULT_TEST_CUT, DEFAULT_VALID_CUT, PROTOCOLS

if TYPE_CHECKING:
    from offline.data.temporal import TemporalProtocol

CUT_HELP = "a quantile of the interaction times in (0, 1) or an ISO date (UTC unless it names a zone)"


def add_protocol_arguments(p: argparse.ArgumentParser, *, refit: bool) -> None:
    g = p.add_argument_group("evaluation protocol (docs/temporal.md)")
    g.add_argument("--protocol", choices=PROTOCOLS, default="loo",
                   help="loo: leave-one-out (each user's last item is the test target; the default); temporal: one "
                   "validation and one test cut in time for every user, training before the validation cut")
    g.add_argument("--valid-cut", default=None, help=f"temporal: the validation cut, {CUT_HELP} "
                   f"(default {DEFAULT_VALID_CUT})")
    g.add_argument("--test-cut", default=None, help=f"temporal: the test cut, {CUT_HELP} (default {DEFAULT_TEST_CUT})")
    if refit:
        g.add_argument("--refit", action="store_true",
                       help="temporal: score the test window with a final fit on everything before the test cut "
                       "(for the epochs the validation chose; the popularity baseline: its counts there)")


def protocol_from(args: argparse.Namespace) -> TemporalProtocol | None:
    """The temporal protocol the flags ask for, or None for leave-one-out (whose use of a temporal flag is
    refused: it would be ignored)."""
    from offline.data.temporal import TemporalProtocol

    refit = bool(getattr(args, "refit", False))
    if args.protocol != "temporal":
        given = [flag for flag, on in (("--valid-cut", args.valid_cut is not None),
                                       ("--test-cut", args.test_cut is not None), ("--refit", refit)) if on]
        if given:
            raise SeqrecError(f"{', '.join(given)} applies to --protocol temporal, not to leave-one-out")
        return None
    return TemporalProtocol(args.valid_cut or DEFAULT_VALID_CUT, args.test_cut or DEFAULT_TEST_CUT, refit)


def refuse_temporal_artifact(artifact: Path) -> None:
    """Leave-one-out scores each user's last item, which a model trained under the temporal protocol may have
    learnt from (every user whose history ends before the validation cut): refused, not scored."""
    trained = _temporal_record(artifact)
    if trained is not None:
        from offline.data.temporal import TemporalError

        raise TemporalError(f"{artifact} was trained under the temporal protocol (cuts {trained.get('valid_cut')}/"
                            f"{trained.get('test_cut')}); leave-one-out would score targets its training saw: "
                            "evaluate it with --protocol temporal and those cuts")


def refuse_temporal_retriever(artifact: Path, command: str) -> None:
    """A ranker is mined, trained and selected on leave-one-out positions: a retriever trained under the temporal
    protocol would be paired with targets of its own validation and test windows."""
    if _temporal_record(artifact) is not None:
        from offline.data.temporal import TemporalError

        raise TemporalError(f"{artifact} was trained under the temporal protocol; `seqrec {command}` mines and "
                            "selects on leave-one-out positions, which would reach into its validation and test "
                            "windows: under the temporal protocol the two-stage path runs as `seqrec pipeline "
                            "--protocol temporal`, mining and selecting before the validation cut (docs/temporal.md)")


def _temporal_record(artifact: Path) -> dict[str, Any] | None:
    """The manifest's protocol record when the artifact was trained under the temporal protocol, else None (also
    when the manifest cannot be read: the command itself then names what is wrong with the artifact)."""
    from retriever.artifact import ArtifactError, read_manifest

    try:
        trained = getattr(read_manifest(artifact), "protocol", None)
    except ArtifactError:
        return None
    return trained if isinstance(trained, dict) and trained.get("protocol") == "temporal" else None
