"""TorchEstimator's settings are checked before anything touches Spark or the data."""

from __future__ import annotations

import pytest

from sparktrain import ConfigurationError
from tests.fixtures.ml_models import digits_mlp

pytest.importorskip("pyspark")


def check(**settings) -> None:
    from sparktrain.ml import TorchEstimator
    from sparktrain.ml.checks import check_settings

    settings.setdefault("modelFactory", digits_mlp)
    check_settings(TorchEstimator(**settings))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"np": 0}, "np must not be 0"),
        ({"backend": "mpi"}, "backend must be one of torch, horovod; got 'mpi'"),
        ({"loss": "hinge"}, "loss must be one of cross_entropy, nll, mse, l1, smooth_l1"),
        ({"loss": lambda out, label: out.sum()}, "set task='classification' or"),
        ({"task": "ranking"}, "task must be one of auto, classification, regression"),
        ({"validationFraction": 1.0}, "validationFraction must be in [0, 1); got 1.0"),
        ({"epochs": 0}, "epochs must be >= 1; got 0"),
        ({"batchSize": 0}, "batchSize must be >= 1; got 0"),
        ({"maxRestarts": -1}, "maxRestarts must be >= 0; got -1"),
        ({"optimizerFactory": "adam"}, "optimizerFactory must be a function"),
        ({"modelFactory": "resnet"}, "TorchEstimator needs modelFactory="),
    ],
)
def test_a_bad_setting_is_refused_with_its_name(settings, message):
    with pytest.raises(ConfigurationError) as error:
        check(**settings)
    assert message in str(error.value)


def test_good_settings_pass_and_the_task_follows_the_loss():
    from sparktrain.ml import TorchEstimator

    check(loss="nll", np=-2, backend="horovod", validationFraction=0.2)
    assert TorchEstimator(loss="nll").resolved_task() == "classification"
    assert TorchEstimator(loss="mse").resolved_task() == "regression"
    assert TorchEstimator(loss="mse", task="classification").resolved_task() == "classification"


def test_params_keep_their_values_through_copy_and_set_params():
    from sparktrain.ml import TorchEstimator

    estimator = TorchEstimator(modelFactory=digits_mlp, epochs=3, inputShape=[1, 8, 8])
    copied = estimator.copy({estimator.epochs: 5})
    assert (copied.getOrDefault("epochs"), estimator.getOrDefault("epochs")) == (5, 3)
    assert copied.getInputShape() == [1, 8, 8]
    estimator.setParams(np=-2)
    assert estimator.getOrDefault("np") == -2
    assert estimator.getOrDefault("epochs") == 3
