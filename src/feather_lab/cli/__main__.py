"""`python -m feather_lab.cli`."""

import sys

from feather_lab.bench.record import take_allow_flag
from feather_lab.cli import app

take_allow_flag(sys.argv)
app()
