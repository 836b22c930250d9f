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


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_histogram_observer_names_inf_where_it_enters(value):
    """x86 default (HistogramObserver activations): the Inf is named as Inf at the module that
    saw it.  torch drops it with a warning, after which it reaches fc1 and surfaces in fc2's
    observer as NaN, naming the wrong module and the wrong value."""
    model = _prepared()
    x = torch.randn(2, 4)
    x[1, 2] = value
    with pytest.raises(ValueError) as info:
        model(x)
    text = str(info.value)
    assert "HistogramObserver of module 'quant'" in text and "contains Inf" in text
    assert "NaN" not in text and "fc2" not in text


def _inf_batch():
    x = torch.randn(2, 4)
    x[0, 3] = float("inf")
    return x


def test_pt2e_names_inf_at_the_node_that_saw_it():
    from torchquant.quantization.quantize_pt2e import prepare_pt2e
    from torchquant.quantization.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)).eval()
    exported = torch.export.export(model, (torch.randn(2, 4),)).module()
    prepared = prepare_pt2e(exported, X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config()))
    with pytest.raises(ValueError, match=r"HistogramObserver of node '\w+': the input contains "
                                         r"Inf") as info:
        prepared(_inf_batch())
    assert "NaN" not in str(info.value)


def test_fx_names_inf_at_the_node_that_saw_it():
    from torchquant.quantization.quantize_fx import prepare_fx
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)).eval()
    prepared = prepare_fx(model, tqq.get_default_qconfig_mapping("x86"), (torch.randn(2, 4),))
    with pytest.raises(ValueError, match=r"HistogramObserver of node '\w+': the input contains "
                                         r"Inf"):
        prepared(_inf_batch())


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
