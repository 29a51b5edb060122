"""What interrupts a run: stop requests, a full disk, and the faults tests inject (an error or a hang at a step)."""
