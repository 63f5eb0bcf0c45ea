"""Analysis: `seqrec analyze` (embedding geometry, where models win, readable predictions, curves)."""
