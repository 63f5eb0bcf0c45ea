"""Evaluation: full-ranking metrics with pessimistic ties, `seqrec evaluate`, breakdowns by group."""
