"""rlft: distributed RL fine-tuning of LLMs (Ray, vLLM rollout actors, LoRA learners).

Unsloth patches torch, transformers and PEFT when it is imported, so in a process that runs an Unsloth learner
it must be the first ML import. Learner processes get `RLFT_IMPORT_UNSLOTH=1` from rl/app.py (learner_env); this file
runs before any rl module (and so before torch) when Ray unpickles the learner class in such a process.

A role process whose environment names a log file (`RLFT_LOG_FILE`, set per role by rl/runtime/placement.py) sends its
stdout and stderr there first, so everything it and the processes it starts print lands in the run's logs/
folder (rl/logs.py).
"""

import os

if os.environ.get("RLFT_LOG_FILE"):
    from rl.logs import redirect_output

    redirect_output(os.environ["RLFT_LOG_FILE"])

if os.environ.get("RLFT_IMPORT_UNSLOTH") == "1":
    import unsloth  # noqa: F401
