"""Parallelism: the process-group bootstrap, the strategies that wrap a model, and pipeline parallelism."""
