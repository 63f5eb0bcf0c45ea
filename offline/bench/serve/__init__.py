"""The service as a running process under open-loop load: latency, throughput, shedding, replicas, profiles, growth."""
