"""The live web board (`python -m launcher board`): what runs wrote, read-only, as JSON and a page.

launcher.board.views reads run directories (standard library only); launcher.board.server is
the web app (Flask, the optional `board` extra) and launcher.board.auth its token check; both are
imported only by the board command.
"""
