"""`python -m moonrun` is the `moonrun` command."""

from moonrun.cli import main

main()
