"""User commands around a run, not part of it: `python -m rl.tools.eval` (evaluate a base model or a trained
policy), plots of a run's metrics.jsonl (`make plot`), the sweep summary (a Hydra callback when a multirun ends; both
read a run's files through rl/run_files.py), the reward-hacking gate (`python -m rewards.check`).

They read a config or a run's output; nothing in the training path (rl/loop/driver.py, rl/learner/, rl/rollout/, ...)
imports them. Keep this file empty of imports: Hydra imports rl.tools.sweep at startup, and a light package keeps
that instant.
"""
