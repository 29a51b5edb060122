"""Where a job runs: this machine, simulated nodes, one node of a multi-machine job, SLURM."""
