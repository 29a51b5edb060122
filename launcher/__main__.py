from launcher import prestart

if __name__ == "__main__":  # `python -m launcher` (the `launcher` command: entry() below)
    prestart.exec_with_zygote()  # first: a launch here execs into bootstrap.py, one torch import for both (prestart)

from launcher import interrupts  # noqa: E402

interrupts.hold()  # first, before the imports below: a Ctrl-C during them is held, then reported in one line
prestart.release()  # after an exec: the stop signals, held since, come to the hold now

from launcher.cli import main  # noqa: E402  (after the hold, on purpose)


def entry() -> None:
    """`python -m launcher` and the `launcher` command (setup.cfg): main, then the process's end (launcher.interrupts)."""
    prestart.exec_with_zygote()  # the `launcher` command's first chance (after the imports above: a tenth of a second)
    interrupts.end(main())


if __name__ == "__main__":
    entry()
