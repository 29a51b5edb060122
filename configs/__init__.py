"""Shipped YAML configs (installed with the package so `--config NAME` works after `pip install .`)."""
