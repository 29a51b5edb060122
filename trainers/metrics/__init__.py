"""What the trainer measures and reports: step metrics, memory, MFU, features, and the loggers (the formats of
goodput's records and of the W&B run are launcher.runtime's)."""
