"""``python -m precguard``: the command line."""

from precguard.cli import main

main()
