"""``python -m leaseq`` runs the command line."""

from leaseq.cli import main

main()
