"""The run's configuration: the schema (schema.py: every setting once, with type, default, description and
check) and the one resolve step (resolve.py) that fills its `auto` values before anything starts.

Import-light (no torch, vllm or ray): `python train.py --help` imports it."""
