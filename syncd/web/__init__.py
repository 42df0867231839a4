"""The web page for people: static files (``static/``) served by ``syncd.http.web``."""
