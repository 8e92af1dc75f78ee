"""One module per ``tinygrad-caps`` command, each with ``run(args)``: train, evaluate, visualize,
gradflow, plot, and profile (``train --profile``)."""
