"""Side-by-side benchmark: leaseq against the raw-SQL limit (run ``python -m bench``)."""
