"""Memory before and during a run: the planner (predicted peak per device), the batch-size finder
(real steps), and the activation and model-state estimates they share."""
