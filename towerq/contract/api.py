"""Where a towerq API answers unless told otherwise: the address `towerq up` and `towerq api`
listen on, and the one the client and the CLI look for."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
