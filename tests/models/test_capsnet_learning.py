"""A reduced CapsNet learns real Fashion-MNIST: 600 training images in batches of 25, two epochs,
fixed seed.

Threshold: with seed 0 this reached 71% test accuracy on 500 test images (seed 1: 63%, seed 2: 71%;
1,000 images in batches of 50 reached 68% and 63% in 1.8x the time), against 10% for chance; we ask
for 50%, far above chance yet clear of run-to-run variation. It takes about 8 s on one core. Skipped
where the Debian package dataset-fashion-mnist is not installed.
"""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.data import BatchIterator, DatasetError, load_dataset
from tinygrad_caps.models import CapsNet, capsule_loss


@pytest.mark.slow
def test_reduced_capsnet_learns_fashion_mnist():
    try:
        train_x, train_y = load_dataset("fashion-mnist", "train", download_missing=False)
        test_x, test_y = load_dataset("fashion-mnist", "test", download_missing=False)
    except DatasetError:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    train_x, train_y, test_x, test_y = train_x[:600], train_y[:600], test_x[:500], test_y[:500]
    tc.manual_seed(0)
    model = CapsNet(conv1_channels=32, primary_types=8, decoder="deconv")
    optimizer = tc.optim.Adam(model.parameters(), lr=2e-3)
    batches = BatchIterator(train_x, train_y, 25, shuffle=True, seed=0)
    for epoch in range(2):
        batches.set_epoch(epoch)
        for x, y in batches:
            _, lengths, recon = model(x, y)
            loss = capsule_loss(lengths, recon, x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with tc.no_grad():
        _, lengths, _ = model(test_x.astype(np.float32) / 255.0)
    accuracy = float((lengths.numpy().argmax(axis=1) == test_y).mean())
    assert accuracy > 0.5, f"test accuracy {accuracy:.3f} after 2 epochs on 600 images"
