"""The data package's error types, and what reading a damaged compressed file raises."""
import zlib

# Reading a gzip stream raises OSError (gzip.BadGzipFile: bad header or CRC), EOFError (truncated)
# or zlib.error (a damaged deflate stream): not an OSError, so every reader names all three.
CORRUPT_STREAM_ERRORS = (OSError, EOFError, zlib.error)


class DatasetError(RuntimeError):
    """A dataset is missing, truncated, corrupt, or not in its format; the message names the file and what to do."""


class DatasetOptionError(DatasetError, ValueError):
    """An option (``--image-size``, ``--channels``, a model's geometry) does not fit the dataset."""
