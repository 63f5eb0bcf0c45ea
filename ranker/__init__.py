"""seqrec ranker."""
