"""seqrec service."""
