"""The application, in three rooms that import only downward:

    cli/       the ``tinygrad-caps`` command line: the parser, and one module per command
               (train, study, evaluate, visualize, gradflow, graph, plot; ``train --profile``), each
               with ``add_arguments(parser)`` and ``run(args)``
    studies/   registered studies, their runner (run folders of a study, the plan in study.json,
               one driver at a time) and their summary
    training/  a training run: ``TrainingConfig`` (the run's options, written once), the Trainer,
               the run folder (``RunFolder``), checkpoints and their schema, crash-consistent logs,
               TensorBoard and gradflow logs, progress, device sums, distributed training, presets,
               resource checks, and how user errors are told from bugs (``reporting``)

It builds on ``capsnet`` and ``analysis``. A process that trains one run elsewhere (a study's
executor) needs exactly a ``TrainingConfig`` and a ``RunFolder``.
"""
