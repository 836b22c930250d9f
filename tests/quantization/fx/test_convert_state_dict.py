"""A converted FX model reads its activation qparams from its ``_scale_<n>`` /
``_zero_point_<n>`` buffers (``get_attr`` nodes), as torch.ao's does: loading another
calibration's state dict gives that calibration's outputs (torch.ao does the same; checked side
by side), also after a deepcopy and through torch.export / torch.compile; an in-place change of a
buffer is seen by the next forward."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch.ao.quantization as ao
import torch.ao.quantization.quantize_fx as ao_fx

from torchquant.quantization import quantize_fx
from torchquant.quantization.qconfig import get_default_qconfig_mapping


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class Mixed(nn.Module):
    """Input quantize, a Linear, add+relu, cat, functional hardswish, conv, sigmoid + add."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x, y):
        a = self.fc(x)
        b = torch.relu(a + x)
        c = F.hardswish(torch.cat([b, a], 1))
        z = self.conv(y)
        return c, torch.sigmoid(z) + z


def _example():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(1, 2, 3, 3, generator=g)


def _two_calibrations(prepare_fx, convert_fx, mapping):
    torch.manual_seed(0)
    model = Mixed().eval()
    x = _example()
    first = prepare_fx(copy.deepcopy(model), mapping, x)
    second = prepare_fx(copy.deepcopy(model), mapping, x)
    first(*x)
    second(*[3 * t + 0.5 for t in x])
    return convert_fx(first), convert_fx(second), x


def _outputs(model, x):
    return [o.dequantize() if hasattr(o, "int_repr") else o for o in model(*x)]


def _assert_same(a, b):
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


def _differ(a, b):
    return any(not torch.equal(u, v) for u, v in zip(a, b))


def test_load_state_dict_takes_the_loaded_activation_qparams_as_torch_ao_does():
    ours = _two_calibrations(quantize_fx.prepare_fx, quantize_fx.convert_fx,
                             get_default_qconfig_mapping("x86"))
    theirs = _two_calibrations(ao_fx.prepare_fx, ao_fx.convert_fx,
                               ao.get_default_qconfig_mapping("x86"))
    for first, second, x in (ours, theirs):
        assert _differ(_outputs(first, x), _outputs(second, x))
        result = first.load_state_dict(second.state_dict())
        assert not result.missing_keys and not result.unexpected_keys
        _assert_same(_outputs(first, x), _outputs(second, x))
    # and the two libraries agree on the loaded model
    _assert_same(_outputs(ours[0], ours[2]), _outputs(theirs[0], theirs[2]))


def test_activation_qparam_buffers_are_the_ones_read():
    first, second, x = _two_calibrations(quantize_fx.prepare_fx, quantize_fx.convert_fx,
                                         get_default_qconfig_mapping("x86"))
    buffers = [k for k in first.state_dict() if k.startswith(("_scale_", "_zero_point_"))]
    assert buffers
    # every saved activation qparam matters: changing any one changes the outputs, whether
    # loaded or changed in place
    before = _outputs(first, x)
    for key in buffers:
        if key.startswith("_scale_"):
            loaded = copy.deepcopy(first)
            state = loaded.state_dict()
            state[key] = state[key] * 2
            loaded.load_state_dict(state)
            assert _differ(_outputs(loaded, x), before), key
            in_place = copy.deepcopy(first)
            getattr(in_place, key).mul_(2)
            _assert_same(_outputs(in_place, x), _outputs(loaded, x))


def test_loaded_qparams_survive_deepcopy_export_and_compile():
    first, second, x = _two_calibrations(quantize_fx.prepare_fx, quantize_fx.convert_fx,
                                         get_default_qconfig_mapping("x86"))
    copied = copy.deepcopy(first)
    copied.load_state_dict(second.state_dict())
    _assert_same(_outputs(copied, x), _outputs(second, x))
    first.load_state_dict(second.state_dict())
    exported = torch.export.export(first, x).module()
    _assert_same(_outputs(exported, x), _outputs(second, x))
    _assert_same(_outputs(torch.compile(first, fullgraph=True), x), _outputs(second, x))


def test_a_bad_loaded_scale_is_refused():
    first, second, x = _two_calibrations(quantize_fx.prepare_fx, quantize_fx.convert_fx,
                                         get_default_qconfig_mapping("x86"))
    state = second.state_dict()
    key = next(k for k in state if k.startswith("_scale_"))
    state[key] = torch.tensor(-1.0)
    with pytest.raises(ValueError, match=key):
        first.load_state_dict(state)



class _Block(nn.Module):
    def __init__(self, functional: bool):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)
        self.functional = functional
        self.w = nn.Parameter(torch.randn(4, 18))
        self.fc = nn.Linear(18, 4)

    def forward(self, y):
        z = torch.sigmoid(torch.relu(self.conv(y))).flatten(1)
        return F.linear(z, self.w) if self.functional else self.fc(z)


class _Nested(nn.Module):
    """Qparam buffers named after nested scopes, model inputs, a float op's output and (with
    ``functional``) a functional linear's weight."""

    def __init__(self, functional: bool = False):
        super().__init__()
        self.block = _Block(functional)
        self.fc = nn.Linear(4, 3)

    def forward(self, y):
        return self.fc(self.block(y)) + 1.0


def _nested_example():
    return (torch.randn(2, 2, 3, 3, generator=torch.Generator().manual_seed(0)),)


@pytest.mark.parametrize("model,example,reference", [
    (Mixed, _example, False), (Mixed, _example, True),
    (_Nested, _nested_example, False), (_Nested, _nested_example, True),
    (lambda: _Nested(functional=True), _nested_example, True),
])
def test_state_dict_keys_are_torch_aos(model, example, reference):
    """The activation qparam buffers carry torch.ao's names (``<module path>[_input]_scale_<n>``),
    the ones a lowered op does not read are dropped as torch.ao drops them (a lowered cat takes
    its first input's qparams), and so do float weights nothing reads: a state dict saved from
    one loads into the other by key.  (A lowered *functional* linear differs: torch.ao keeps one
    opaque packed-weight object, torchquant a quantized Linear submodule.)"""
    torch.manual_seed(0)
    float_model, x = model().eval(), example()
    keys = []
    for fx, mapping in ((quantize_fx, get_default_qconfig_mapping("x86")),
                        (ao_fx, ao.get_default_qconfig_mapping("x86"))):
        prepared = fx.prepare_fx(copy.deepcopy(float_model), mapping, x)
        prepared(*x)
        convert = fx.convert_to_reference_fx if reference else fx.convert_fx
        keys.append(sorted(convert(prepared).state_dict()))
    assert keys[0] == keys[1]
    assert any("_input_scale_" in k for k in keys[0])


def test_a_functional_linears_float_weight_leaves_the_converted_model():
    torch.manual_seed(0)
    x = _nested_example()
    prepared = quantize_fx.prepare_fx(_Nested(functional=True).eval(),
                                      get_default_qconfig_mapping("x86"), x)
    prepared(*x)
    converted = quantize_fx.convert_fx(prepared)
    assert "block.w" not in converted.state_dict()
    assert "block.conv.weight" in converted.state_dict()  # the quantized conv's own weight
    converted(*x)


def test_torch_relu_and_the_flatten_method_stay_float_as_in_torch_ao():
    """torch.ao's lowering runs only its listed copy ops on quantized tensors; ``torch.relu``
    and ``.flatten()`` are not listed, so they run in float and are requantized to their own
    observers' qparams (another scale than their input's here: the outputs differed by a step)."""
    torch.manual_seed(0)
    model, x = _Nested().eval(), _nested_example()
    outputs = []
    for fx, mapping in ((quantize_fx, get_default_qconfig_mapping("x86")),
                        (ao_fx, ao.get_default_qconfig_mapping("x86"))):
        prepared = fx.prepare_fx(copy.deepcopy(model), mapping, x)
        prepared(*x)
        outputs.append(fx.convert_fx(prepared)(*x))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
