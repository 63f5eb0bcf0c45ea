"""What the benches share: the open-loop load client, server and Redis processes, request bodies, model measurement
and rate sweeps."""
