"""Seed experiments as single commands: sweeps, several runs at once, hyperparameter search, ensembles."""
