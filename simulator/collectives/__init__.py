"""Collective algorithms as phase plans (one module each), their names (names.py), their registry and `auto` rule
(registry.py), and the executor on the network model (execute.py).

Nothing is re-exported here, so that importing names.py (as the scenario schema does) loads no algorithm, executor
or network model.
"""
