"""`python -m offline.cli ...` (as torchrun needs): the `seqrec` command."""

import sys

from offline.cli import main

sys.exit(main())
