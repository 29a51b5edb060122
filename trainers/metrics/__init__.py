"""What the trainer measures and reports: step metrics, goodput, memory, MFU, stragglers, and the loggers."""
