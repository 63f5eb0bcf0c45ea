"""The evaluation protocols' names and the temporal protocol's default cuts (Gusak et al., RecSys 2025), in a module
of no imports so that the CLI builds its parsers without numpy (offline/data/temporal.py holds the split)."""

PROTOCOLS = ("loo", "temporal")
DEFAULT_VALID_CUT = "0.8"
DEFAULT_TEST_CUT = "0.9"
