"""The host name a Celery worker of the deployment test gives the task instances it runs
(``[core] hostname_callable``): its own name, as both workers run on one host."""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    """``SZ_WORKER_NAME`` of this process's environment, or the host's name."""
    return os.environ.get("SZ_WORKER_NAME") or socket.getfqdn()
