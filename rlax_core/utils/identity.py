"""``process_identity``: the one name of this process in what it writes for others to read (claims on
steps, busy notices, which worker generated a group), ``HOST:PID``."""

from __future__ import annotations

import os
import socket


def process_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
