"""One RankerConfig: the CLI flags, the pipeline config and train_ranker share its defaults."""

import pytest
from pydantic import ValidationError

from common.errors import SeqrecError
from offline.cli import build_parser
from offline.jobs.pipeline import PipelineConfig
from ranker.config import MLPConfig, RankerConfig, RankerSection


def _defaults(command: str) -> dict[str, object]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {a.dest: a.default for a in sub._actions}


def test_the_commands_and_the_pipeline_take_the_same_defaults() -> None:
    config = RankerConfig()
    assert (config.kind, config.mining, config.depth, config.per_user) == ("auto", "holdout", 100, 3)
    train_ranker = _defaults("train-ranker")
    assert (train_ranker["kind"], train_ranker["mining"]) == (config.kind, config.mining)
    assert (train_ranker["sources"], train_ranker["cooc_share"], train_ranker["features"], train_ranker["members"]) == (
        config.sources, config.cooc_share, config.features, config.members)
    mine = _defaults("mine")
    for flags in (mine, train_ranker):
        assert (flags["depth"], flags["per_user"], flags["holdout_per_user"]) == (
            config.depth, config.per_user, config.holdout_per_user)
    assert mine["holdout"] is False  # `seqrec mine` alone mines directly unless asked
    mlp = MLPConfig(n_items=1, n_meta=1, n_year_buckets=1, dim=1)
    assert {k: train_ranker[k] for k in ("loss", "id_dropout", "epochs", "lr", "seed")} == {
        "loss": mlp.loss, "id_dropout": mlp.id_dropout, "epochs": mlp.epochs, "lr": mlp.lr, "seed": mlp.seed}
    section = PipelineConfig.model_validate({"name": "x", "data": {"dataset": "synthetic"}, "retriever": "r.yaml"})
    assert section.ranker == RankerSection()
    assert section.ranker.model_dump() == config.model_dump() == {
        "kind": "auto", "mining": "holdout", "depth": 100, "per_user": 3, "holdout_per_user": 2,
        "sources": ("retriever",), "cooc_share": 0.25, "features": (), "members": 1}
    assert mlp.members == config.members == 1


def test_a_pipeline_config_is_held_to_the_bounds_the_cli_leaves_to_mining() -> None:
    for bad in ({"depth": 5}, {"depth": 2001}, {"per_user": 0}, {"holdout_per_user": 1}, {"kind": "forest"},
                {"extra": 1}, {"sources": ["retriever", "ease"]}, {"cooc_share": 1.5}, {"members": 0},
                {"members": 17}):
        with pytest.raises(ValidationError):
            RankerSection.model_validate(bad)
    assert RankerConfig(depth=5000).depth == 5000  # the CLI's --depth has no ceiling; mining checks the floor
    assert RankerConfig(mining="direct").holdout is False
    with pytest.raises(ValidationError, match="per_user"):  # no group to train on: an error, not an empty concat
        RankerConfig(per_user=0)


@pytest.mark.parametrize(("option", "message"), [
    ({"epochs": 0}, "epochs must be >= 1, got 0"),  # an AssertionError after mining before
    ({"lr": -1.0}, "lr must be >= 0 and finite, got -1.0"),  # torch's "Invalid learning rate" before
    ({"lr": float("inf")}, "lr must be >= 0 and finite, got inf"),  # every weight NaN after one step before
    ({"weight_decay": float("inf")}, "weight_decay must be >= 0 and finite, got inf"),
    ({"id_dropout": 1.0}, r"id_dropout must be in \[0, 1\), got 1.0"),
    ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ({"members": 0}, "members must be >= 1, got 0"),
])
def test_mlp_options_that_cannot_train_a_network_are_seqrec_errors(option: dict, message: str) -> None:
    with pytest.raises(SeqrecError, match=message):
        MLPConfig(n_items=1, n_meta=1, n_year_buckets=1, dim=1, **option)
