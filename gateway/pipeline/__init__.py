"""Pipelines: DAGs of models and numpy functions, served as one model (Harpagon, FA2)."""
