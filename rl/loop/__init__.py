"""The training loop, in the order one step calls it: the batch source (sampler.py, synchronous and bounded
staleness; continuous.py, rollouts that never stop), batch preparation (prepare.py: rewards to advantages to masked
samples), the driver that runs the steps (driver.py), held-out evaluation (evaluation.py), the sync probe
(probe.py) and checkpoints (checkpoint.py). Nothing here starts a process: the roles arrive as a Runtime."""
