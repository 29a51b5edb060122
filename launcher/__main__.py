from launcher import interrupts

interrupts.hold()  # first, before the imports below: a Ctrl-C during them is held, then reported in one line

from launcher.cli import main  # noqa: E402  (after the hold, on purpose)


def entry() -> None:
    """`python -m launcher` and the `launcher` command (setup.cfg): main, then the process's end (launcher.interrupts)."""
    interrupts.end(main())


if __name__ == "__main__":
    entry()
