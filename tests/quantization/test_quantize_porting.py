"""Details of the eager workflow that ported torch.ao code relies on, against torch 2.13:
the observer hook's place among user hooks, ``_get_observer_dict``, the private module path of
``_LearnableFakeQuantize`` and ``nn.quantized.MaxPool2d``."""
import pytest
import torch
import torch.ao.nn.quantized as ao_nnq
import torch.ao.quantization as aoq
from torch import nn
from torch.ao.quantization.quantize import _get_observer_dict as theirs_get_observer_dict

import torchquant as tq
import torchquant.nn.quantized as nnq
import torchquant.quantization as tqq
from torchquant.quantization.quantize import _get_observer_dict


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = nn.Identity()
        self.conv = nn.Conv2d(3, 4, 3)
        self.block = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())

    def forward(self, x):
        return self.block(self.conv(self.quant(x)))


def _record_hooks(model, log):
    def hook(mod, inp, out):
        log.append(("user", out.detach().clone()))
    model.conv.register_forward_hook(hook)


def _prepared(api, qat):
    torch.manual_seed(0)
    model = _Net()
    log = []
    _record_hooks(model, log)
    if qat:
        model.qconfig = api.get_default_qat_qconfig("x86")
        model = api.prepare_qat(model.train())
    else:
        model.qconfig = api.default_qconfig
        model = api.prepare(model.eval())
    model.conv.activation_post_process.register_forward_pre_hook(
        lambda mod, inp: log.append(("observer", None)))
    return model, log


def test_observer_hook_runs_before_earlier_user_hooks_as_torch():
    for qat in (False, True):
        ours, our_log = _prepared(tqq, qat)
        theirs, their_log = _prepared(aoq, qat)
        x = torch.randn(2, 3, 6, 6)
        ours(x), theirs(x)
        assert [k for k, _ in our_log] == [k for k, _ in their_log] == ["observer", "user"]
        # under QAT the user hook sees the fake-quantized output, as in torch
        assert torch.equal(our_log[1][1], their_log[1][1])


def test_get_observer_dict_matches_torch():
    ours, _ = _prepared(tqq, qat=False)
    theirs, _ = _prepared(aoq, qat=False)
    a, b = {}, {}
    _get_observer_dict(ours, a)
    theirs_get_observer_dict(theirs, b)
    assert list(a) == list(b) and "conv.activation_post_process" in a
    assert all(a[k] is ours.get_submodule(k) for k in a)
    a, b = {}, {}
    _get_observer_dict(ours, a, "model")
    theirs_get_observer_dict(theirs, b, "model")
    assert list(a) == list(b)


def test_learnable_fake_quantize_module_path():
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as Theirs

    from torchquant.quantization._learnable_fake_quantize import _LearnableFakeQuantize
    assert _LearnableFakeQuantize is tqq.fake_quantize._LearnableFakeQuantize
    ours = _LearnableFakeQuantize(tqq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                  use_grad_scaling=True)
    theirs = Theirs(aoq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                    use_grad_scaling=True)
    x = torch.randn(4, 8)
    ours(x), theirs(x)
    ours.enable_param_learning(), theirs.enable_param_learning()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa * 1.5), theirs(xb * 1.5)
    ya.sum().backward(), yb.sum().backward()
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    assert torch.equal(ours.scale.grad, theirs.scale.grad)
    assert torch.equal(ours.zero_point.grad, theirs.zero_point.grad)


def test_quantized_maxpool2d_matches_torch():
    assert nnq.MaxPool2d is ao_nnq.MaxPool2d  # torch's is the float module itself
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8)
    ours = tq.quantize_per_tensor(x, 0.05, 7, tq.quint8)
    theirs = torch.quantize_per_tensor(x, 0.05, 7, torch.quint8)
    pool = nnq.MaxPool2d(3, stride=2, padding=1, dilation=1, ceil_mode=True)
    y, y_ref = pool(ours), pool(theirs)
    assert isinstance(y, tq.QTensor)
    assert torch.equal(y.int_repr(), y_ref.int_repr())
    assert (y.q_scale(), y.q_zero_point()) == (y_ref.q_scale(), y_ref.q_zero_point())


def _transpose_model(api, qconfig):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 1), nn.ConvTranspose2d(4, 2, 2)).eval()
    model.qconfig = qconfig
    try:
        return api.prepare(model), None
    except AssertionError as exc:
        return None, str(exc)


def test_per_channel_weight_observer_on_conv_transpose_rejected_at_prepare_as_torch():
    """torch's propagate_qconfig_ rejects a per-channel weight observer on a ConvTranspose
    whatever its ch_axis (AssertionError); a per-tensor one, or a per-channel fake-quant (not
    an observer instance, so torch lets it through), pass."""
    cases = [
        lambda api: api.get_default_qconfig("x86"),
        lambda api: api.QConfig(activation=api.default_observer,
                                weight=api.PerChannelMinMaxObserver.with_args(
                                    ch_axis=1, dtype=torch.qint8,
                                    qscheme=torch.per_channel_symmetric)),
        lambda api: api.default_qconfig,
        lambda api: api.get_default_qat_qconfig("x86"),
    ]
    for make in cases:
        ours = _transpose_model(tqq, make(tqq))
        theirs = _transpose_model(aoq, make(aoq))
        assert ours[1] == theirs[1]
        assert (ours[0] is None) == (theirs[0] is None)
    with pytest.raises(AssertionError, match="Per channel weight observer"):
        tqq.propagate_qconfig_(nn.Sequential(nn.ConvTranspose1d(2, 2, 1)),
                               {nn.ConvTranspose1d: tqq.get_default_qconfig("x86")})
