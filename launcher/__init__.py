"""A distributed training launcher for PyTorch: one command from laptop to cluster."""
