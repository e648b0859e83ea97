"""The run's inputs: the prompts and their seeds (prompts.py), which prompts come next (curriculum.py), reward
shaping and the group filters (filters.py), and demonstrations for the warm start (demos.py)."""
