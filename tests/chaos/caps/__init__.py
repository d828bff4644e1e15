"""The capabilities' part of the chaos run: one module per capability (its workload and
its checks, a ``Capability`` of ``base.py``), gathered by ``suite.py``."""
