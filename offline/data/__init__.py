"""Data: dataset readers, `seqrec prepare`, the prepared-folder format, the leave-one-out split."""
