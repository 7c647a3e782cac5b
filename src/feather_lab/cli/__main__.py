"""`python -m feather_lab.cli`."""

from feather_lab.cli import app

app()
