"""The Python API: launcher.launch and launcher.submit run a function on every rank through the CLI's own launch."""
