"""The web UI: the chat playground at `/`, the operations page, try-it panels and `/docs`.

Static pages and assets only, all inside this package (`pages/`, `static/`): the pages call the
public API like any client, so nothing here reaches into the gateway. Every response carries a
Content-Security-Policy that allows scripts, styles and connections from this origin alone.
"""
