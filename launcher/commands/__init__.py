"""The subcommands besides `run`: compare, scale, doctor, resume."""
