"""Calibration messages name the module they are about (issue #15): Inf is called Inf, an
observer that never ran says whose it was, absurd ranges (|x| >= 1e30) warn."""
import warnings

import pytest
import torch
from torch import nn

import torchquant.quantization as tqq


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tqq.QuantStub()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.dequant = tqq.DeQuantStub()

    def forward(self, x, skip_fc2=False):
        y = self.fc1(self.quant(x))
        return self.dequant(y if skip_fc2 else self.fc2(y))


def _prepared(backend_qconfig="x86", observer=None):
    model = Net().eval()
    model.qconfig = tqq.get_default_qconfig(backend_qconfig) if observer is None else tqq.QConfig(
        activation=observer, weight=tqq.default_per_channel_weight_observer)
    return tqq.prepare(model)


@pytest.mark.parametrize("observer", [tqq.MinMaxObserver, tqq.MovingAverageMinMaxObserver,
                                      tqq.PerChannelMinMaxObserver.with_args(ch_axis=1)])
@pytest.mark.parametrize("value,kind", [(float("inf"), "Inf"), (float("-inf"), "Inf"),
                                        (float("nan"), "NaN")])
def test_non_finite_calibration_data_says_which_and_where(observer, value, kind):
    model = _prepared(observer=observer)
    x = torch.randn(2, 4)
    x[0, 1] = value
    with pytest.raises(ValueError) as info:
        model(x)
    text = str(info.value)
    assert f"of module 'quant'" in text and f"contains {kind}" in text
    if kind == "Inf":
        assert "NaN" not in text


def test_histogram_observer_inf_warning_names_module():
    model = _prepared()  # x86 default: HistogramObserver activations
    x = torch.randn(2, 4)
    x[1, 2] = float("inf")
    # The Inf dropped by the stub's histogram still reaches fc1 and turns into NaN in fc2.
    with pytest.warns(UserWarning, match=r"HistogramObserver of module 'quant': ignoring \+-inf"), \
            pytest.raises(ValueError, match="HistogramObserver of module 'fc2'.*NaN"):
        model(x)


@pytest.mark.parametrize("observer", [tqq.MinMaxObserver, tqq.HistogramObserver])
def test_unobserved_module_is_named_at_convert(observer):
    model = _prepared(observer=observer)
    model(torch.randn(2, 4), skip_fc2=True)
    with pytest.warns(UserWarning, match="of module 'fc2': must run observer before calling "
                                         "calculate_qparams") as record:
        tqq.convert(model)
    assert not any("of module 'fc1'" in str(w.message) for w in record)


@pytest.mark.parametrize("observer", [tqq.MinMaxObserver, tqq.HistogramObserver,
                                      tqq.PerChannelMinMaxObserver.with_args(ch_axis=1)])
def test_absurd_calibration_range_warns_once_naming_module(observer):
    model = _prepared(observer=observer)
    x = torch.randn(2, 4)
    x[0, 0] = 3e30
    with pytest.warns(UserWarning, match=r"of module 'quant': the calibration data reaches 3e\+30"):
        model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model(x)  # once per observer


def test_ordinary_calibration_does_not_warn():
    model = _prepared(observer=tqq.MinMaxObserver)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(8, 4) * 1e6)


@pytest.mark.parametrize("value,kind", [(float("inf"), "Inf"), (float("nan"), "NaN")])
def test_fused_fake_quant_names_kind_and_module(value, kind):
    model = Net().train()
    model.qconfig = tqq.get_default_qat_qconfig("x86")
    model = tqq.prepare_qat(model)
    x = torch.randn(2, 4)
    x[0, 0] = value
    with pytest.raises(ValueError, match=f"of module 'quant': input has {kind} values"):
        model(x)
