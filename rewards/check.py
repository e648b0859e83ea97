"""`python -m rewards.check reward=<name> [overrides] [-v]`: the reward-hacking gate, run by rl/tools/reward_check.py.

Only the command's name lives here, beside the rewards it checks; importing this module imports nothing, so
rewards/ stays free of the run's machinery (configs, engines) that the gate needs.
"""

if __name__ == "__main__":
    import sys

    from rl.tools.reward_check import main

    sys.exit(main(sys.argv[1:]))
