"""`python -m riverbed.cli`: the same as the `riverbed` command."""

from riverbed.cli import main

main()
