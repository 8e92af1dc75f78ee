"""A training run: its options (``config.TrainingConfig``), the loop (``trainer``), its folder
(``run_folder.RunFolder``), checkpoints (``checkpoints``, ``checkpoint_schema``), crash-consistent
logs (``run_state``, ``run_logs``), TensorBoard and gradflow logs, progress bars, device sums,
distributed training (``distributed``), presets, resource checks, the resume rules
(``run_options``), output paths and option checks, and how a user error is told from a bug
(``reporting``)."""
