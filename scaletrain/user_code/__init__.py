"""The user's own code as scaletrain meets it: a failure of theirs shown as theirs (failures.py)."""
