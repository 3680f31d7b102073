"""`scaletrain autotune`: the fastest system settings for one training on this machine (knobs.py:
what may be turned; search.py: planning, measuring and the loss check)."""
