"""What the deployment and UI tests need from outside the project's virtualenv, installed the way a
person would: Debian packages with ``apt-get`` (as root) and Python packages with ``pip`` into the
running interpreter's environment, each pinned in a requirements file next to the test.

Nothing is downloaded except through those two clients; when a package is missing and cannot be
installed (not root, no network), the error says which package and how to install it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

#: apt-get update runs at most once per test session.
_APT_UPDATED = False


def apt_install(packages: Iterable[str]) -> None:
    """Install Debian ``packages`` with apt-get (the caller has found them missing).

    :param packages: Debian package names.
    :raises RuntimeError: when apt-get cannot install them (not root, no apt-get, a failure).
    """
    global _APT_UPDATED
    names = list(packages)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(
            f"missing Debian packages {names}: install them with "
            f"'sudo apt-get install -y {' '.join(names)}' and run the test again"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _APT_UPDATED:
        run_command(["apt-get", "update", "-q"], env, 600)
        _APT_UPDATED = True
    run_command(["apt-get", "install", "-y", "-q", "--no-install-recommends", *names], env, 900)


def ensure_python_packages(requirements: Path, modules: Iterable[str]) -> None:
    """``pip install -r requirements`` into this interpreter unless every module in ``modules`` imports.

    :param requirements: a pinned requirements file.
    :param modules: top-level module names the requirements provide.
    """
    if all(importlib.util.find_spec(module) is not None for module in modules):
        return
    run_command(
        [sys.executable, "-m", "pip", "install", "--quiet", "-r", str(requirements)], dict(os.environ), 600
    )
    importlib.invalidate_caches()


def run_command(command: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run ``command`` with no standard input; its standard output.

    :param command: the program and its arguments.
    :param env: its environment (``None``: this process's).
    :param timeout: seconds it may take.
    :raises RuntimeError: it failed; the message names the command and quotes the end of its output.
    """
    log.info("running %s", " ".join(command))
    result = subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"'{' '.join(command)}' failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
        )
    return result.stdout
