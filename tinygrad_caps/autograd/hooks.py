"""The hooks the walk runs: ``register_hook`` hooks on the gradient reaching a tensor, and
post-accumulate hooks on a leaf as soon as its ``.grad`` is complete (the walk, engine.py, tells
when that is)."""
from __future__ import annotations


def run_hooks(hooks, grad):
    """``grad`` passed through each hook in turn; a hook's non-None return replaces it."""
    for hook in hooks or ():
        replaced = hook(grad)
        if replaced is not None:
            grad = replaced
    return grad


def post_hooks(tensor):
    """The post-accumulate hooks registered on ``tensor`` (None or a list)."""
    return getattr(tensor, "_post_accumulate_hooks", None)


def run_post_accumulate_hooks(tensor):
    """Call each post-accumulate hook of ``tensor`` with it, now that its ``.grad`` is complete."""
    for hook in list(post_hooks(tensor) or ()):
        hook(tensor)
