"""Commands and callbacks around a run, not part of it: the preflight plan (`train.py plan=true`), plots of a
run's metrics.jsonl (`make plot`), the sweep summary (a Hydra callback when a multirun ends) and the install
check (`make install`).

They read a config or a run's output and never start Ray, vLLM or a learner, so nothing in the training path
(rl/driver.py, rl/learner.py, rl/rollout.py, ...) imports them. Keep this file empty of imports: Hydra imports
rl.tools.sweep at startup, and a light package keeps that instant.
"""
