"""rlft: distributed RL fine-tuning of LLMs (Ray, vLLM rollout actors, LoRA learners).

Unsloth patches torch, transformers and PEFT when it is imported, so in a process that runs an Unsloth learner
it must be the first ML import. Learner processes get `RLFT_IMPORT_UNSLOTH=1` from rl/placement.py; this file
runs before any rl module (and so before torch) when Ray unpickles the learner class in such a process.
"""

import os

if os.environ.get("RLFT_IMPORT_UNSLOTH") == "1":
    import unsloth  # noqa: F401
