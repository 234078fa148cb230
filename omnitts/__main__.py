"""`python -m omnitts ...` is the `omnitts` command."""

from .launch import main

main()
