"""The engine's ops, one small Function class per primitive, grouped by family.

Users call them through :mod:`tinygrad_caps.functional` (or the Tensor methods).
"""
