"""A user script's steps, read back from its workers' records: metrics.jsonl rows, W&B and summary figures."""
