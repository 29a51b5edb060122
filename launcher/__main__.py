from launcher import interrupts

interrupts.hold()  # first, before the imports below: a Ctrl-C during them is held, then reported in one line

from launcher import prestart  # noqa: E402

prestart.release()  # after prestart's exec: the stop signals, held since, come to the hold now

from launcher.cli import main, zygote_kind  # noqa: E402  (after the hold, on purpose)


def entry() -> None:
    """`python -m launcher` and the `launcher` command (setup.cfg): main, then the process's end (launcher.interrupts)."""
    prestart.exec_with_zygote(zygote_kind)  # a launch whose workers fork here: one torch import for both (prestart)
    interrupts.end(main())


if __name__ == "__main__":
    entry()
