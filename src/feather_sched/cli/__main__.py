"""`python -m feather_sched.cli`."""

from feather_sched.cli import app

app()
