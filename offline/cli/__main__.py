"""`python -m offline.cli ...` (as torchrun needs): the `seqrec` command."""

import logging
import os
import sys

from offline.cli import main
from retriever.distributed import Distributed

code = main()
if Distributed.from_env() is not None:
    # A torchrun worker whose work is done (every artifact written, the process group destroyed) leaves without
    # the interpreter's teardown: there, gloo's native threads have aborted a finished worker ("terminate called
    # without an active exception", exit -6), once in a clean-clone CI run of `torchrun ... train --distributed`
    # and twice in another worker of the tests, so a job that had written its artifact reported a failure.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
