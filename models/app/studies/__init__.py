"""Studies: the registry (``registry``), the plan a study folder keeps in study.json (``plan_file``),
the one-driver lock (``lock``), the runner that trains a study's run folders (``runner``) and the
summary of their results (``summary``). Builds on ``training``."""
