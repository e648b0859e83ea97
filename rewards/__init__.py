"""Reward functions: `(completions, *, answer, **kwargs) -> list[float]`.

Parameterised rewards are picklable classes (they cross process boundaries), not closures.
"""
