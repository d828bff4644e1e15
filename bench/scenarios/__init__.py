"""The scenarios of ``python -m bench``, one module each (a family of twins shares one):
each defines its scenario function(s), its ``Scenario`` (name, metrics, function) and the
ratios it contributes. ``bench.catalog`` puts them in their canonical order."""
