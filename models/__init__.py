"""CapsNet and its training tools, built on the engine; installed as ``tinygrad_caps.models``."""
