"""Dynamic quantized Conv1d/2d/3d and ConvTranspose1d/2d/3d against torch.ao (engine x86;
fbgemm for the transposed convs, see ``torch_engine_for``).

torch's ``conv*_dynamic`` ops quantize the input per call (ATen's qparams rule, reduce_range
by default), run the quantized conv, requantize to the *input's* qparams and dequantize; ours
do the same on the same integers, so the outputs are bit-identical.  With the default
``reduce_range=True`` the activations are 0..127, where torch's AVX2 u8 x s8 kernels are exact
(tests/conftest.py); the ``reduce_range=False`` case compares with torch only where its kernels
are exact on the full range, and otherwise with our static conv on the same quantized input.
"""
import contextlib
import io
import warnings

import pytest
import torch
import torch.ao.nn.quantized.dynamic as ao_nnqd
import torch.ao.quantization as aoq
from torch import nn

import torchquant as tq
import torchquant.nn.quantized as nnq
import torchquant.nn.quantized.dynamic as nnqd
import torchquant.quantization as tqq

pytestmark = pytest.mark.filterwarnings("ignore:The current implementation of the")

CASES = [
    # (name, float module, input shape, kwargs)
    ("Conv1d", nn.Conv1d, (2, 4, 11), dict(kernel_size=3, stride=2, padding=1)),
    ("Conv2d", nn.Conv2d, (2, 4, 7, 6), dict(kernel_size=(3, 2), padding=1, dilation=(1, 2))),
    ("Conv2d", nn.Conv2d, (1, 4, 6, 6), dict(kernel_size=3, padding=1,
                                               padding_mode="reflect", groups=2)),
    ("Conv3d", nn.Conv3d, (1, 4, 4, 5, 5), dict(kernel_size=2, stride=(1, 2, 1))),
    ("ConvTranspose1d", nn.ConvTranspose1d, (2, 4, 6), dict(kernel_size=3, stride=2,
                                                             output_padding=1)),
    ("ConvTranspose2d", nn.ConvTranspose2d, (2, 4, 5, 4), dict(kernel_size=3, padding=1,
                                                                groups=2)),
    ("ConvTranspose3d", nn.ConvTranspose3d, (1, 4, 3, 4, 4), dict(kernel_size=2, stride=2,
                                                                   bias=False)),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]


@contextlib.contextmanager
def torch_engine_for(name):
    """torch.ao's engine to build and run ``name`` under: x86, except for a transposed conv
    without output padding on an AVX-512 VNNI CPU, where torch's x86 engine hands it to
    oneDNN's quantized deconvolution, whose results are wrong in torch 2.13 (tens of steps off
    the exact integer deconvolution, with or without ``ONEDNN_MAX_CPU_ISA=AVX2``; with output
    padding, or without VNNI, x86 runs fbgemm's).  fbgemm's is exact on every CPU."""
    old = torch.backends.quantized.engine
    if "Transpose" in name:
        torch.backends.quantized.engine = "fbgemm"
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def _float(float_cls, kwargs):
    torch.manual_seed(0)
    return float_cls(4, 6, **kwargs).eval()


@pytest.mark.parametrize("qconfig", ["per-tensor", "per-channel"])
@pytest.mark.parametrize("name,float_cls,shape,kwargs", CASES, ids=IDS)
def test_from_float_forward_matches_torch(name, float_cls, shape, kwargs, qconfig):
    if qconfig == "per-channel":
        if "Transpose" in name:  # torch: "Per Channel Quantization is currently disabled for
            pytest.skip("transposed conv"); ch_axis = 1  # transposed conv" (x86 / fbgemm)
        ch_axis = 0
        ours_qc = tqq.QConfig(activation=tqq.default_dynamic_quant_observer,
                              weight=tqq.PerChannelMinMaxObserver.with_args(
                                  dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                  ch_axis=ch_axis))
        theirs_qc = aoq.QConfig(activation=aoq.default_dynamic_quant_observer,
                                weight=aoq.PerChannelMinMaxObserver.with_args(
                                    dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                    ch_axis=ch_axis))
    else:
        ours_qc, theirs_qc = tqq.default_dynamic_qconfig, aoq.default_dynamic_qconfig
    a, b = _float(float_cls, kwargs), _float(float_cls, kwargs)
    a.qconfig, b.qconfig = ours_qc, theirs_qc
    ours = getattr(nnqd, name).from_float(a)
    with torch_engine_for(name):
        theirs = getattr(ao_nnqd, name).from_float(b)
    assert ours._get_name() == theirs._get_name()
    assert torch.equal(ours.weight().int_repr(), theirs.weight().int_repr())
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(shape) * (seed + 1) + seed
        with torch_engine_for(name):
            y, y_ref = ours(x), theirs(x)
        assert y.dtype == torch.float32 and not isinstance(y, tq.QTensor)
        assert torch.equal(y, y_ref), (y - y_ref).abs().max()


@pytest.mark.parametrize("name,float_cls,shape,kwargs", CASES, ids=IDS)
def test_full_range_reduce_range_false(name, float_cls, shape, kwargs, torch_oracle_exact_u8):
    conv = _float(float_cls, kwargs)
    conv.qconfig = tqq.default_dynamic_qconfig
    ours = getattr(nnqd, name).from_float(conv)
    torch.manual_seed(1)
    x = torch.randn(shape)
    y = ours(x, reduce_range=False)
    if torch_oracle_exact_u8:
        b = _float(float_cls, kwargs)
        b.qconfig = aoq.default_dynamic_qconfig
        with torch_engine_for(name):
            assert torch.equal(y, getattr(ao_nnqd, name).from_float(b)(x, reduce_range=False))
    # the same as the static conv on the dynamically quantized input, requantized to its qparams
    scale, zp = torch._choose_qparams_per_tensor(x, False)
    static = getattr(nnq, name)._from_geometry(conv)
    static.set_weight_bias(ours.weight(), ours.bias())
    static.scale, static.zero_point = scale, zp
    expected = static(tq.quantize_per_tensor(x, scale, zp, tq.quint8)).dequantize()
    assert torch.equal(y, expected)


@pytest.mark.parametrize("name,float_cls,shape,kwargs", CASES[:2] + CASES[4:5],
                         ids=IDS[:2] + IDS[4:5])
def test_state_dict_round_trip_and_torch_checkpoint(name, float_cls, shape, kwargs):
    conv = _float(float_cls, kwargs)
    conv.qconfig = tqq.default_dynamic_qconfig
    ours = getattr(nnqd, name).from_float(conv)
    b = _float(float_cls, kwargs)
    b.qconfig = aoq.default_dynamic_qconfig
    theirs = getattr(ao_nnqd, name).from_float(b)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    geometry = dict(kwargs)
    geometry["kernel_size"] = kwargs["kernel_size"]
    buf = io.BytesIO()
    torch.save(ours.state_dict(), buf)
    buf.seek(0)
    fresh = getattr(nnqd, name)(4, 6, **geometry)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(shape)
    assert torch.equal(fresh(x), ours(x))
    # a state dict saved by torch loads too (its weight is a torch quantized tensor)
    from_torch = getattr(nnqd, name)(4, 6, **geometry)
    from_torch.load_state_dict(theirs.state_dict())
    assert torch.equal(from_torch(x), theirs(x))


def test_quantize_dynamic_uses_them_when_asked():
    """In the default dynamic mapping (torch 2.13 has them commented out there, so its
    quantize_dynamic(model, {nn.Conv2d}) silently keeps the convs float); the default
    qconfig_spec names no conv, so nothing changes unless the user asks for convs."""
    ours_default = tqq.get_default_dynamic_quant_module_mappings()
    for cls in (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                nn.ConvTranspose3d):
        assert ours_default[cls] is getattr(nnqd, cls.__name__)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.ConvTranspose2d(4, 2, 2)).eval()
    mapping = {nn.Conv2d: nnqd.Conv2d, nn.ConvTranspose2d: nnqd.ConvTranspose2d}
    ao_mapping = {nn.Conv2d: ao_nnqd.Conv2d, nn.ConvTranspose2d: ao_nnqd.ConvTranspose2d}
    spec = {nn.Conv2d, nn.ConvTranspose2d}
    ours = tqq.quantize_dynamic(model, spec, mapping=mapping)
    with torch_engine_for("ConvTranspose2d"):  # fbgemm for both convs: exact on every CPU
        theirs = aoq.quantize_dynamic(model, spec, mapping=ao_mapping)
    assert [type(m).__name__ for m in ours] == [type(m).__name__ for m in theirs]
    assert isinstance(ours[0], nnqd.Conv2d) and isinstance(ours[2], nnqd.ConvTranspose2d)
    x = torch.randn(2, 3, 7, 7)
    with torch_engine_for("ConvTranspose2d"):
        assert torch.equal(ours(x), theirs(x))
    # the default mapping gives the same modules and values as torch with the explicit mapping
    default = tqq.quantize_dynamic(model, spec)
    assert [type(m) for m in default] == [type(m) for m in ours]
    with torch_engine_for("ConvTranspose2d"):
        assert torch.equal(default(x), theirs(x))
    # and a default-spec quantize_dynamic leaves convs alone, as torch's
    with pytest.warns(UserWarning, match="no module was quantized"):
        untouched = tqq.quantize_dynamic(model)
    assert type(untouched[0]) is nn.Conv2d
