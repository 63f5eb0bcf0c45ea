"""seqrec service."""

import os

# OpenMP threads that finish a parallel region spin for more work by default; on a machine whose cores other
# jobs share, the spinning threads take the cores from each other (training ran 14x slower, batch-1 forwards
# 15x: docs/results/serve/threads.md). PASSIVE makes them sleep. Read once when the OpenMP runtime starts,
# so it is set here, before anything imports torch; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
