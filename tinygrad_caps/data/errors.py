"""The data package's error type."""


class DatasetError(RuntimeError):
    """A dataset is missing, truncated, corrupt, or not in its format; the message names the file and what to do."""


class DatasetOptionError(DatasetError, ValueError):
    """An option (``--image-size``, ``--channels``, a model's geometry) does not fit the dataset."""
