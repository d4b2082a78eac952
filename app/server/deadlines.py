"""The server's connection deadlines and cap (app/server/header_timeout.py applies them): here, without
uvicorn, so that every command's parser (`inferlab serve --help` among them) builds where the HTTP stack is
not installed (the lent GPU image)."""
HEADER_TIMEOUT_S = 10.0  # a client on a slow link sends a request head in well under a second
BODY_TIMEOUT_S = 60.0  # the largest body allowed (4 MiB, app/server/limits.py) at ~0.5 Mbit/s
KEEP_ALIVE_S = 5  # uvicorn's default: an idle keep-alive connection is closed after this
MAX_CONNECTIONS = 512  # open connections; a request past them is answered 503 (half a common fd limit)
