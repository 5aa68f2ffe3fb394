"""The examples' data, with no downloads: torchvision's MNIST / CIFAR-10 when usable, else
scikit-learn's bundled digits or generated CIFAR-shaped tensors.

The loaders run on every rank (the examples call them inside their training functions);
the choice of data is made once on the driver (:func:`mnist_choice`, :func:`cifar_choice`)
and passed to the ranks, so every rank loads the same thing and the driver can say at start
what it is.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

DIGITS_TEST_SIZE = 360  # of the 1797 bundled digits; the other 1437 train


class DataChoice(NamedTuple):
    """Which data an example trains on, decided once on the driver.

    Attributes:
        kind: ``"mnist"``, ``"digits"``, ``"cifar10"`` or ``"synthetic"``.
        description: one line for the user.
    """

    kind: str
    description: str


def torchvision_or_reason() -> tuple[Any, str]:
    """``(torchvision, "")`` when it imports, else ``(None, why)``.

    A torchvision wheel built for another torch can fail at import with errors other than
    ImportError (``RuntimeError: operator torchvision::nms does not exist``), so any error
    counts as "not usable".
    """
    try:
        import torchvision
    except Exception as exc:
        return None, f"torchvision is not usable here ({type(exc).__name__}: {exc})"
    return torchvision, ""


def mnist_choice(data_dir: str | None) -> DataChoice:
    """MNIST from ``data_dir`` when it is there and torchvision works, else the digits."""
    fallback = (
        "scikit-learn's bundled handwritten digits (1797 real 8x8 images, upsampled to 28x28; "
        f"{1797 - DIGITS_TEST_SIZE} train / {DIGITS_TEST_SIZE} test), no download"
    )
    why = _torchvision_dataset_problem(data_dir, "MNIST")
    if why:
        return DataChoice("digits", f"{fallback}: {why}")
    return DataChoice("mnist", f"MNIST from {data_dir} (torchvision)")


def cifar_choice(data_dir: str | None, train_size: int, test_size: int) -> DataChoice:
    """CIFAR-10 from ``data_dir`` when it is there and torchvision works, else generated data."""
    fallback = (
        f"generated CIFAR-10-shaped tensors (3x32x32, 10 classes, {train_size} train / "
        f"{test_size} test; each class is a smooth colour pattern plus noise, so it is "
        "learnable)"
    )
    why = _torchvision_dataset_problem(data_dir, "CIFAR10")
    if why:
        return DataChoice("synthetic", f"{fallback}: {why}")
    return DataChoice("cifar10", f"CIFAR-10 from {data_dir} (torchvision)")


def _torchvision_dataset_problem(data_dir: str | None, name: str) -> str:
    """Why torchvision's ``name`` cannot be used from ``data_dir`` ('' when it can)."""
    if not data_dir:
        return "no --data-dir given"
    if not os.path.isdir(data_dir):
        return f"--data-dir {data_dir} does not exist"
    torchvision, why = torchvision_or_reason()
    if torchvision is None:
        return why
    try:
        getattr(torchvision.datasets, name)(data_dir, train=False, download=False)
    except Exception as exc:  # torchvision says "Dataset not found" with a RuntimeError
        return f"no {name} under {data_dir} ({type(exc).__name__}: {exc})"
    return ""


def digits_tensors(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """The bundled digits as ``(x_train, y_train, x_test, y_test)``, x of shape (N, 1, 8, 8).

    Pixels are standardised with the training set's mean and standard deviation; the split
    is a fixed shuffle of ``seed``, the same on every rank.
    """
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test, train = order[:DIGITS_TEST_SIZE], order[DIGITS_TEST_SIZE:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return x[train], y[train], x[test], y[test]


def load_mnist_like(kind: str, data_dir: str | None = None) -> tuple[Any, Any]:
    """``(train, test)`` datasets of 1x28x28 images and labels 0-9 for ``kind``.

    Args:
        kind: ``"mnist"`` (torchvision, from ``data_dir``) or ``"digits"``.
        data_dir: torchvision's data root, for ``"mnist"``.
    """
    import torch
    from torch.utils.data import TensorDataset

    if kind == "mnist":
        from torchvision import datasets, transforms

        transform = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
        )
        return (
            datasets.MNIST(data_dir, train=True, download=False, transform=transform),
            datasets.MNIST(data_dir, train=False, download=False, transform=transform),
        )
    x_train, y_train, x_test, y_test = digits_tensors()

    def upsample(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(
            x, size=(28, 28), mode="bilinear", align_corners=False
        )

    return TensorDataset(upsample(x_train), y_train), TensorDataset(upsample(x_test), y_test)


def load_cifar_like(
    kind: str, data_dir: str | None = None, train_size: int = 2048, test_size: int = 512
) -> tuple[Any, Any]:
    """``(train, test)`` datasets of 3x32x32 images and labels 0-9 for ``kind``.

    Args:
        kind: ``"cifar10"`` (torchvision, from ``data_dir``) or ``"synthetic"``.
        data_dir: torchvision's data root, for ``"cifar10"``.
        train_size, test_size: sizes of the generated sets.
    """
    if kind == "cifar10":
        from torchvision import datasets, transforms

        transform = transforms.Compose(
            [
                transforms.ToTensor(),
                transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
            ]
        )
        return (
            datasets.CIFAR10(data_dir, train=True, download=False, transform=transform),
            datasets.CIFAR10(data_dir, train=False, download=False, transform=transform),
        )
    return synthetic_cifar(train_size, seed=1), synthetic_cifar(test_size, seed=2)


def synthetic_cifar(size: int, seed: int, noise: float = 2.5) -> Any:
    """``size`` CIFAR-shaped samples: a smooth colour pattern per class, scaled, plus noise.

    The ten patterns come from a fixed seed, so train and test sets (different ``seed``)
    share them and a network can learn them; the noise keeps it from being trivial.
    """
    import torch
    from torch.utils.data import TensorDataset

    patterns = torch.nn.functional.interpolate(
        torch.randn(10, 3, 4, 4, generator=torch.Generator().manual_seed(0)),
        size=(32, 32),
        mode="bicubic",
        align_corners=False,
    )
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (size,), generator=g)
    contrast = 0.6 + 0.8 * torch.rand(size, 1, 1, 1, generator=g)
    images = patterns[labels] * contrast + noise * torch.randn(size, 3, 32, 32, generator=g)
    return TensorDataset(images, labels)
