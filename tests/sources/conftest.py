"""The emulator and trigger helpers of the trigger tests, shared with the source tests."""

from __future__ import annotations

import os

from tests.airflow.test_triggers import emulator, rules_file  # noqa: F401 - fixtures


def inotify_descriptors() -> int:
    """Open inotify descriptors of this process."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                count += 1
        except OSError:
            continue
    return count
