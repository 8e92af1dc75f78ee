"""The application: the ``tinygrad-caps`` command line (``cli``, one module per command under
``commands/``), the training loop, checkpoints and their schema, run folders and their logs,
presets, resource checks and distributed training. It builds on ``capsnet`` and ``analysis``."""
