"""SLURM: submission, the task inside the allocation, job records, status/logs/cancel, its environment."""
