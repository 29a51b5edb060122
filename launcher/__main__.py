import sys

from launcher import interrupts

interrupts.hold()  # first, before the imports below: a Ctrl-C during them is held, then reported in one line

from launcher.cli import main  # noqa: E402  (after the hold, on purpose)

if __name__ == "__main__":
    sys.exit(main())
