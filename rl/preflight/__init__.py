"""What is checked before and around a run, never inside it: the memory/topology plan (`train.py plan=true`),
the diagnosis of a role that failed to start (diagnose.py) and the install check (`make install`).

Nothing in the training loop imports this package (tests/unit/test_imports.py checks it): rl/app.py asks it to
explain a start-up failure after the fact, and train.py runs the plan instead of a run."""
