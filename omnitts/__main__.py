"""`python -m omnitts ...` is the `omnitts` command."""

from .cli import main

main()
