"""Offline side of seqrec: datasets, splits, metrics, evaluation and the `seqrec` CLI."""
