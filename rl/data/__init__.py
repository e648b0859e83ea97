"""What the learner trains on, from prompt to sample: the prompts and their seeds (prompts.py), the step's batch
(sampler.py, with dynamic sampling), which prompts come next (curriculum.py), reward shaping and the group filters
(filters.py), and rewards turned into advantages and masked samples (prepare.py)."""
