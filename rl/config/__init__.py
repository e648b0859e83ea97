"""The run's configuration: the schema (schema.py and its groups' modules: every setting once, with type, default,
description and check). The resolve step that fills its `auto` values before anything starts is rl/resolve.py, above
what it reads.

Import-light (no torch, vllm or ray): `python train.py --help` imports it."""
