"""The live web board (`python -m launcher board`): what runs wrote, read-only, as JSON and a page.

launcher.board.views assembles a run's page (standard library only) from launcher.board.files (the checked
readers: never through a symlink), events (what happened, at its step), timing (where the time went), live
(the header's rate and ETA) and series (every launcher.log call); groups and runlist are a sweep's page and
the run list. launcher.board.server is the web app (Flask, the optional `board` extra) and
launcher.board.auth its token check; both are imported only by the board command.
"""
