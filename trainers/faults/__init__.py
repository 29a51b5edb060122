"""What interrupts a run: stop requests and the faults tests inject (an error or a hang at a step)."""
