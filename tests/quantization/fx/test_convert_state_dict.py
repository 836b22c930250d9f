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
