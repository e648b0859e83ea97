"""`python -m rl.preflight.check_install`: fail fast, with one line per problem, if the environment cannot run the demo.

Run at the end of `make install`; catches what a pip resolve does not (PyPI's torchvision beside the CPU torch
breaks transformers' model classes; the embedded model wheel must be present).
"""

from __future__ import annotations

import importlib
import sys


def main() -> int:
    problems = []
    checks = [
        ("torch", "import torch"),
        ("transformers model classes", "from transformers import LlamaForCausalLM, Qwen2ForCausalLM"),
        ("peft", "import peft"),
        ("ray", "import ray"),
        ("hydra", "import hydra, omegaconf"),
        (
            "math-verify",
            "from math_verify import parse, verify; assert verify(parse('$0.5$'), parse('$\\\\frac{1}{2}$'))",
        ),
        ("reasoning-gym", "import reasoning_gym"),
        ("vllm", "import vllm"),
        ("hydra-ray-launcher", "import hydra_plugins.hydra_ray_launcher._core"),  # hydra/launcher=ray_cluster
    ]
    for name, code in checks:
        try:
            exec(code, {})
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    for banned in ("torchvision", "torchaudio", "torchcodec"):
        if importlib.util.find_spec(banned) is not None:
            problems.append(
                f"{banned} is installed and breaks transformers beside torch 2.13 CPU: pip uninstall {banned}"
            )
    try:
        from rl.model_path import embedded_gguf

        embedded_gguf("smollm2-135m-instruct")
    except Exception as e:  # noqa: BLE001
        problems.append(str(e))
    for p in problems:
        print(f"check_install: {p}", file=sys.stderr)
    if not problems:
        import torch
        import vllm

        print(f"check_install: ok (torch {torch.__version__}, vllm {vllm.__version__})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
