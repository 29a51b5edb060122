from launcher import interrupts

interrupts.hold()  # first, before the imports below: a Ctrl-C during them is held, then reported in one line

from launcher import prestart  # noqa: E402

prestart.release()  # after prestart's exec: the stop signals, held since, come to the hold now

from launcher.cli import main  # noqa: E402  (after the hold, on purpose)


def entry() -> None:
    """`python -m launcher` and the `launcher` command (setup.cfg): main, then the process's end (launcher.interrupts).
    A launch whose workers fork here execs this process once on its way (launcher.prestart) and goes on in main."""
    interrupts.end(main())


if __name__ == "__main__":
    entry()
