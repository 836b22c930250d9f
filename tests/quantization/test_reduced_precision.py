"""Half / bfloat16 and converted models (issue #15): nothing silently changes the outputs.

torch.ao raises ``RuntimeError: Quantize only works on Float Tensor, got Half`` for half or
bfloat16 input to a converted QuantStub / ``torch.quantize_per_tensor``: so do we, with the
same type and message.  ``.half()`` / ``.bfloat16()`` on a converted model is accepted by torch
(its packed weights are opaque) but rounds the float32 Quantize scale; here it raises."""
import pytest
import torch
import torch.ao.quantization as ao_q
from torch import nn

import torchquant
import torchquant.quantization as tqq


def _converted(ns):
    torch.manual_seed(0)
    model = nn.Sequential(ns.QuantStub(), nn.Linear(4, 4), nn.ReLU(), ns.DeQuantStub()).eval()
    model.qconfig = ns.default_qconfig
    prepared = ns.prepare(model)
    prepared(torch.randn(8, 4))
    return ns.convert(prepared)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "Half"), (torch.bfloat16, "BFloat16"),
                                        (torch.float64, "Double"), (torch.int64, "Long")])
def test_non_float32_input_to_converted_stub_raises_like_torch(dtype, name):
    x = (torch.randn(2, 4) * 3).to(dtype)
    with pytest.raises(RuntimeError, match=f"Quantize only works on Float Tensor, got {name}"):
        _converted(ao_q)(x)
    with pytest.raises(RuntimeError, match=f"Quantize only works on Float Tensor, got {name}$"):
        _converted(tqq)(x)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "Half"), (torch.bfloat16, "BFloat16")])
def test_reduced_precision_input_to_quantize_functions_raises_like_torch(dtype, name):
    x = torch.randn(3).to(dtype)
    message = f"Quantize only works on Float Tensor, got {name}"
    with pytest.raises(RuntimeError, match=message):
        torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
    with pytest.raises(RuntimeError, match=message):
        torchquant.quantize_per_tensor(x, 0.1, 0, torchquant.quint8)
    with pytest.raises(RuntimeError, match=message):
        torchquant.quantize_per_tensor_dynamic(x, torchquant.quint8, False)
    with pytest.raises(RuntimeError, match=message):
        torchquant.quantize_per_channel(x, torch.ones(3), torch.zeros(3, dtype=torch.long), 0,
                                        torchquant.quint8)


@pytest.mark.parametrize("convert_to", ["half", "bfloat16", "double"])
def test_float_dtype_change_of_converted_model_raises(convert_to):
    model = _converted(tqq)
    with pytest.raises(RuntimeError, match="is a quantized module: converting it to torch"):
        getattr(model, convert_to)()


def test_dynamic_model_half_raises_and_device_moves_still_work():
    model = tqq.quantize_dynamic(nn.Sequential(nn.Linear(4, 4)))
    x = torch.randn(2, 4)
    before = model(x)
    with pytest.raises(RuntimeError, match="quantized module"):
        model.to(torch.float16)
    torch.testing.assert_close(model.to("cpu").float()(x), before, rtol=0, atol=0)
