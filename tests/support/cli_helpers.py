"""What the tests of the command (tests/app/) share to run ``tinygrad-caps train`` in this process on the
tiny IDX dataset: the options of the tiny models, the dataset's folder, ``train()`` and the check of a
one-line error. The fixtures built on them (``data_dir``) are in tests/app/conftest.py.

A test file that needs other values keeps its own, named for what they are (test_resume_options.py's
RUN differs from every default on purpose; test_routing_cli.py's SMALL has 5x5 kernels)."""
from helpers import write_striped_dataset
from tinygrad_caps.models import cli

# A tiny CapsNet: 4 conv1 channels, 2 primary types of 4D capsules, 4D digit capsules, 3x3 kernels, a
# decoder of 16 and 32 units (DECODER: the paper's 512 and 1024 were 99% of the parameters and most of
# the work), batches of 8, no progress bars.
DECODER = ["--decoder-hidden", "16,32"]
TINY = ["--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4", "--digit-dim", "4",
        "--kernel-size", "3", *DECODER, "--batch-size", "8", "--no-progress"]
TINY_CPU = [*TINY, "--device", "cpu"]
# Smaller still (3 conv1 channels, 3D capsules), on the CPU.
TINY_DIM3_CPU = ["--conv1-channels", "3", "--primary-types", "2", "--primary-dim", "3", "--digit-dim", "3",
                 "--kernel-size", "3", *DECODER, "--batch-size", "8", "--no-progress", "--device", "cpu"]


def tiny_data_dir(root, counts=(40, 16), **options):
    """``root`` holding the dataset "tiny" (``root/tiny``): ``counts`` = (training, test) striped 10x10
    images of 3 classes (``helpers.write_striped_dataset``, which takes ``options``); returns ``root``,
    the folder for ``--data-dir``."""
    write_striped_dataset(root / "tiny", counts, **options)
    return root


def train_argv(data_dir, out, *extra, options=TINY, dataset="tiny"):
    """The arguments of ``tinygrad-caps train`` of ``dataset`` in ``data_dir`` into ``out``: ``options``, then ``extra``."""
    return ["train", "--dataset", dataset, "--data-dir", str(data_dir), "--out", str(out), *options, *extra]


def train(data_dir, out, *extra, options=TINY):
    """``tinygrad-caps train`` (``train_argv``) run in this process; its exit status."""
    return cli.main(train_argv(data_dir, out, *extra, options=options))


def one_line_error(capsys, status):
    """The one line on stderr of a command that ended with exit status 2 and no traceback."""
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
