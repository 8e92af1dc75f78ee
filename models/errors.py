"""The error type for mistakes in what a user asked for or supplied, as opposed to bugs.

The CLI reports a :class:`UsageError` (and the few other user-error types listed in
``models/app/training/reporting.py``) as one line with exit status 2; any other exception is a bug and is shown
with its traceback. It sits at the package's root, below the layers, because analysis raises
it too (matplotlib or Pillow missing), not only app.
"""


class UsageError(ValueError):
    """A bad option value, an unusable file or folder, or a run the machine cannot hold; the message says which."""


class TrainingDiverged(UsageError):
    """The training loss or the weights became non-finite; the last good checkpoint is kept."""
