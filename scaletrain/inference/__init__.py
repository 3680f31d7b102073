"""A trained run's model outside training: rebuilt from the run's record, exported for serving."""
