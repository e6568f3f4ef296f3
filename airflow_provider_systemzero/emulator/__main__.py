"""``python -m airflow_provider_systemzero.emulator`` — same as ``systemzero-emulator``."""

import sys

from airflow_provider_systemzero.emulator.cli import main

sys.exit(main())
