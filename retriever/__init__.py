"""seqrec retriever."""
