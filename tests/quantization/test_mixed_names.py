"""Half-renamed models (issue #15): torch.ao objects inside a torchquant workflow raise a
TypeError naming the module and the torchquant name; torch's own QAT switches applied with
``model.apply`` act on torchquant's QAT modules exactly as torchquant's switches do."""
import copy

import pytest
import torch
import torch.ao.nn.intrinsic as ao_nni
import torch.ao.nn.intrinsic.qat as ao_nniqat
import torch.ao.nn.quantized as ao_nnq
import torch.ao.quantization as ao_q
import torch.nn.intrinsic as legacy_nni
import torch.quantization as legacy_q
from torch import nn

import torchquant.nn.quantized as nnq
import torchquant.quantization as tqq


class Net(nn.Module):
    def __init__(self, quant=None, add=None):
        super().__init__()
        self.quant = quant if quant is not None else tqq.QuantStub()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.add = add if add is not None else nnq.FloatFunctional()
        self.dequant = tqq.DeQuantStub()

    def forward(self, x):
        y = self.relu(self.bn(self.conv(self.quant(x))))
        return self.dequant(self.add.add(y, y))


@pytest.mark.parametrize("stage", ["prepare", "prepare_qat"])
@pytest.mark.parametrize("case", ["quant_stub", "legacy_quant_stub", "float_functional"])
def test_torch_modules_in_the_model_raise_naming_module_and_replacement(stage, case):
    if case == "quant_stub":
        model, where, use = Net(quant=ao_q.QuantStub()), "quant:", "torchquant.quantization.QuantStub"
    elif case == "legacy_quant_stub":
        model, where, use = Net(quant=legacy_q.QuantStub()), "quant:", \
            "torchquant.quantization.QuantStub"
    else:
        model, where, use = Net(add=ao_nnq.FloatFunctional()), "add:", \
            "torchquant.nn.quantized.FloatFunctional"
    model.qconfig = tqq.get_default_qat_qconfig("x86")
    if stage == "prepare":
        model.eval()
    with pytest.raises(TypeError) as info:
        getattr(tqq, stage)(model)
    assert where in str(info.value) and use in str(info.value)
    assert "torch.ao" in str(info.value)


@pytest.mark.parametrize("qconfig_source", ["torch_qconfig", "torch_observer_in_our_qconfig"])
def test_torch_qconfig_raises(qconfig_source):
    model = Net().eval()
    if qconfig_source == "torch_qconfig":
        model.conv.qconfig = ao_q.get_default_qconfig("x86")
        expected = "conv: its qconfig is torch's QConfig"
    else:
        model.conv.qconfig = tqq.QConfig(activation=ao_q.MinMaxObserver.with_args(),
                                         weight=tqq.default_weight_observer)
        expected = "torchquant.quantization.MinMaxObserver"
    model.qconfig = tqq.get_default_qconfig("x86")
    with pytest.raises(TypeError, match=expected):
        tqq.prepare(model)


def test_torch_qconfig_in_quantize_dynamic_raises():
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="0: its qconfig is torch's"):
        tqq.quantize_dynamic(model, {nn.Linear: ao_q.default_dynamic_qconfig})


def test_torch_fused_module_raises_instead_of_staying_float():
    model = nn.Sequential(tqq.QuantStub(), legacy_nni.ConvReLU2d(nn.Conv2d(3, 3, 1), nn.ReLU()),
                          tqq.DeQuantStub()).eval()
    model.qconfig = tqq.get_default_qconfig("x86")
    with pytest.raises(TypeError, match=r"1: torch\.ao\.nn\.intrinsic.*torchquant\.nn\.intrinsic\.ConvReLU2d"):
        tqq.prepare(model)


def test_torch_prepared_model_into_torchquant_convert_raises():
    model = Net(quant=ao_q.QuantStub(), add=ao_nnq.FloatFunctional()).eval()
    model.qconfig = ao_q.get_default_qconfig("x86")
    prepared = ao_q.prepare(model)
    with pytest.raises(TypeError) as info:
        tqq.convert(prepared)
    text = str(info.value)
    assert "quant: torch.ao.quantization.stubs.QuantStub" in text
    assert "conv.activation_post_process" in text and "torchquant.quantization.HistogramObserver" in text


def test_pure_torchquant_model_is_accepted():
    model = Net().eval()
    model.qconfig = tqq.get_default_qconfig("x86")
    prepared = tqq.prepare(model)
    prepared(torch.randn(2, 3, 8, 8))
    tqq.convert(prepared)


def _qat_model():
    model = Net().train()
    model.qconfig = tqq.get_default_qat_qconfig("x86")
    tqq.fuse_modules_qat(model, [["conv", "bn", "relu"]], inplace=True)
    return tqq.prepare_qat(model)


def _flags(model):
    return {name: (int(m.observer_enabled[0]), int(m.fake_quant_enabled[0]))
            for name, m in model.named_modules() if isinstance(m, tqq.FakeQuantizeBase)}


@pytest.mark.parametrize("ns", [ao_q, legacy_q], ids=["torch.ao.quantization", "torch.quantization"])
def test_torch_fake_quant_switches_act_on_torchquant_modules(ns):
    ours, theirs = _qat_model(), _qat_model()
    assert all(v == (1, 1) for v in _flags(theirs).values())
    for name in ("disable_observer", "disable_fake_quant"):
        ours.apply(getattr(tqq, name))
        theirs.apply(getattr(ns, name))
        assert _flags(ours) == _flags(theirs)
    assert all(v == (0, 0) for v in _flags(theirs).values())
    for name in ("enable_observer", "enable_fake_quant"):
        theirs.apply(getattr(ns, name))
    assert all(v == (1, 1) for v in _flags(theirs).values())


@pytest.mark.parametrize("fn_ns", [ao_nniqat, torch.nn.intrinsic.qat],
                         ids=["torch.ao.nn.intrinsic.qat", "torch.nn.intrinsic.qat"])
def test_torch_freeze_bn_stats_acts_on_torchquant_conv_bn(fn_ns):
    model = _qat_model()
    model.apply(fn_ns.freeze_bn_stats)
    assert model.conv.freeze_bn and not model.conv.bn.training
    before = model.conv.bn.running_mean.clone()
    model(torch.randn(4, 3, 8, 8))
    torch.testing.assert_close(model.conv.bn.running_mean, before, rtol=0, atol=0)
    model.apply(fn_ns.update_bn_stats)
    assert not model.conv.freeze_bn and model.conv.bn.training
    model(torch.randn(4, 3, 8, 8))
    assert not torch.equal(model.conv.bn.running_mean, before)


def test_torch_switches_still_work_on_torch_modules():
    """The torchquant override only adds: torch's own modules are switched by torch as before."""
    model = copy.deepcopy(nn.Sequential(ao_nni.ConvBn2d(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3))))
    model.train()
    model.qconfig = ao_q.get_default_qat_qconfig("x86")
    prepared = ao_q.prepare_qat(model)
    prepared.apply(ao_q.disable_observer)
    prepared.apply(ao_nniqat.freeze_bn_stats)
    assert prepared[0].freeze_bn
    assert int(prepared[0].weight_fake_quant.observer_enabled[0]) == 0
