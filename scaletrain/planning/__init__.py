"""Planners: predict before running (data-parallel scaling; issue 4 adds memory)."""
