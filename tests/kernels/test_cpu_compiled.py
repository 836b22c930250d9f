"""The kernels torchquant compiles for itself (cpu_compiled) ignore the user's global inductor
configuration: same results under e.g. ``freezing=True``, and the user's config untouched."""
import pytest
import torch
import torch._inductor.config as inductor_config
from torch import nn

from torchquant import quantization as tqq
from torchquant.kernels import cpu_compiled
from torchquant.kernels.onednn_exactness import onednn_u8s8_exact


@pytest.fixture
def fresh_kernels(monkeypatch):
    """Empty kernel caches (so each run below compiles its kernels), compilation on a
    signature's first call."""
    def reset():
        monkeypatch.setattr(cpu_compiled, "_kernels", {})
        monkeypatch.setattr(cpu_compiled, "_calls", {})
        monkeypatch.setattr(cpu_compiled, "_broken", set())
    monkeypatch.setattr(cpu_compiled, "HOT_CALLS", 1)
    reset()
    return reset


class _Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tqq.QuantStub(), tqq.DeQuantStub()
        self.conv = nn.Conv2d(64, 64, 3)

    def forward(self, x):
        return self.dequant(self.conv(self.quant(x)))


def _run_models():
    """Build (weight quantization compiles too) and run a dynamic quantized Linear(384, 384) on
    a large input, its per-token form, a static quantized Conv2d(64, 64, 3) and a dynamic
    LSTM; each model twice."""
    torch.manual_seed(0)
    linear = tqq.quantize_dynamic(nn.Sequential(nn.Linear(384, 384)), {nn.Linear})
    per_token = tqq.quantize_dynamic(nn.Sequential(nn.Linear(384, 384)),
                                     {nn.Linear: tqq.per_token_dynamic_qconfig})
    lstm = tqq.quantize_dynamic(nn.Sequential(nn.LSTM(16, 32)), {nn.LSTM})
    x = torch.randn(256, 384)
    seq = torch.randn(3, 2, 16)
    outs = [linear(x), linear(x), per_token(x), per_token(x), lstm(seq)[0], lstm(seq)[0]]
    conv = _Conv().eval()
    conv.qconfig = tqq.get_default_qconfig("x86")
    conv = tqq.prepare(conv)
    images = torch.randn(2, 64, 30, 30)
    conv(images)
    conv = tqq.convert(conv)
    outs += [conv(images), conv(images)]
    return outs


def _config_value(name):
    obj = inductor_config
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("settings", [
    {"freezing": True}, {"max_autotune": True}, {"cpp_wrapper": True},
    {"fallback_random": True}, {"cpp.enable_unsafe_math_opt_flag": True},
], ids=lambda s: ",".join(s))
def test_user_inductor_config_does_not_reach_our_kernels(fresh_kernels, settings):
    expected = _run_models()
    built = set(cpu_compiled._kernels)
    kinds = {"quantize", "dequantize"}
    if onednn_u8s8_exact():  # the fused per-token row kernel runs only where oneDNN is exact
        kinds.add("per_token_rows_u8")
    assert {key[0] for key in built} >= kinds
    user_values = {name: _config_value(name) for name in settings}
    fresh_kernels()
    with inductor_config.patch(settings):
        outs = _run_models()
        for name, value in settings.items():  # our compilation left the user's values alone
            assert _config_value(name) == value
    assert {name: _config_value(name) for name in settings} == user_values
    assert not cpu_compiled._broken
    assert set(cpu_compiled._kernels) == built  # the same kernels, compiled under the patch
    assert outs[0].shape == outs[2].shape == (256, 384) and outs[4].shape == (3, 2, 32)
    assert outs[6].shape == (2, 64, 28, 28)
    for out, ref in zip(outs, expected):
        assert torch.equal(out, ref)


def test_kernel_built_under_freezing_matches_the_eager_formula(fresh_kernels):
    from torchquant.kernels.reference import dequantize_formula
    ints = torch.randint(-128, 128, (1 << 16,), dtype=torch.int8)
    args = (ints, torch.tensor(0.05, dtype=torch.float64), torch.tensor(3), False)
    with inductor_config.patch(freezing=True, max_autotune=True):
        kernel = cpu_compiled.compiled("dequantize", args)
        assert kernel is not None
        out = kernel([ints, args[1], args[2]])[0]
        assert inductor_config.freezing is True and inductor_config.max_autotune is True
    assert not cpu_compiled._broken
    assert torch.equal(out, dequantize_formula(*args))
    assert torch.equal(out, (ints.float() - 3) * torch.tensor(0.05, dtype=torch.float32))


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("numel, offset", [(8192, 0), (8196, 4), (8194, 0), (8200, 1)])
def test_add_on_words_equals_the_reference(fresh_kernels, numel, offset, relu):
    """quint8 operands read four to an int32 word (lengths and offsets that allow it) give the
    reference formula's integers; the others take the byte kernel."""
    from torchquant.kernels.reference import add_formula
    torch.manual_seed(numel + offset)
    base_x = torch.randint(0, 256, (numel + offset,), dtype=torch.uint8)
    base_y = torch.randint(0, 256, (numel + offset,), dtype=torch.uint8)
    x, y = base_x[offset:], base_y[offset:]
    operands = tuple(torch.tensor(v) for v in (0.031, -0.093, 0.047, -6.11, 1 / 0.06, 77.0))
    args = (x, y, *operands, 0, 255, torch.uint8, relu)
    kernel = cpu_compiled.add_kernel(args)
    assert torch.equal(kernel([x, y, *operands]), add_formula(*args))
    words = numel % 4 == 0 and offset % 4 == 0
    assert any(key[0] == ("add_words" if words else "add") for key in cpu_compiled._kernels)
