"""Ops and modules on the device against the fp64 oracle, over sequence lengths (op-check)."""
