"""`seqrec backtest`: nightly retraining replayed over time through the served system (docs/backtest.md)."""
