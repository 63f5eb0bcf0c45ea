"""What the recommendations are worth: the backbone and two-stage tables, served parity, depth, sources, policies."""
