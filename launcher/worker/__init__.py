"""The worker process: its first code (bootstrap) and the built-in trainer's entry."""
