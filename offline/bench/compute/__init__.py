"""The model's work in one process, no HTTP: forward latency, compiled encoders, batches, indexes, threads, ceilings."""
