"""The roles of a run driven as one: their typed protocols (roles.py), members in this process or as Ray actors
(groups.py, placement.py), the actor pool with its faults and restarts (pool.py), adapter sync (sync.py) and the
generations in flight under bounded staleness (pipeline.py)."""
