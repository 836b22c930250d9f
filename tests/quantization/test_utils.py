"""torchquant.quantization.utils against torch.ao.quantization.utils."""
import pytest
import torch
import torch.ao.quantization as tq
import torch.ao.quantization.utils as tu

import torchquant
from torchquant import affine
from torchquant.quantization import QuantType
from torchquant.quantization import qconfig as qc
from torchquant.quantization import quant_type
from torchquant.quantization import utils as qu
from torchquant.quantization import observer as obs
from torchquant.quantization import fake_quantize as fq

pytestmark = pytest.mark.filterwarnings("ignore:.*reduce_range.*:UserWarning")


def test_range_helpers_are_affines():
    assert qu.calculate_qmin_qmax is affine.calculate_qmin_qmax
    assert qu.validate_qmin_qmax is affine.validate_qmin_qmax
    assert qu.check_min_max_valid is affine.check_min_max_valid
    with pytest.raises(AssertionError):
        qu.validate_qmin_qmax(1, 10)
    with pytest.raises(AssertionError):
        qu.validate_qmin_qmax(0, 0)


@pytest.mark.parametrize("qscheme", [torch.per_tensor_affine, torch.per_tensor_symmetric,
                                     torch.per_channel_affine, torch.per_channel_symmetric,
                                     torch.per_channel_affine_float_qparams])
@pytest.mark.parametrize("dtype,qrange,custom", [
    (torch.quint8, (0, 255), False), (torch.qint8, (-128, 127), False),
    (torch.quint8, (0, 127), True), (torch.qint8, (-127, 127), True)])
def test_determine_qparams_matches_torch(qscheme, dtype, qrange, custom):
    per_channel = qscheme in (torch.per_channel_affine, torch.per_channel_symmetric,
                              torch.per_channel_affine_float_qparams)
    shape = (5,) if per_channel else ()
    min_val = -torch.rand(shape) * 3
    max_val = torch.rand(shape) * 2
    eps = torch.tensor([torch.finfo(torch.float32).eps])
    ours = qu.determine_qparams(min_val, max_val, *qrange, dtype, eps, custom, qscheme)
    theirs = tu.determine_qparams(min_val, max_val, *qrange, dtype, eps, custom, qscheme)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_determine_qparams_unobserved_returns_defaults():
    with pytest.warns(UserWarning, match="must run observer"):
        scale, zp = qu.determine_qparams(torch.tensor(float("inf")), torch.tensor(float("-inf")),
                                         0, 255, torchquant.quint8,
                                         torch.tensor([affine.FP32_EPS]), False)
    assert scale.tolist() == [1.0] and zp.tolist() == [0]


@pytest.mark.parametrize("name,data", [
    ("MinMaxObserver", torch.randn(10)),
    ("PerChannelMinMaxObserver", torch.randn(3, 4)),
    ("PlaceholderObserver", torch.randn(3)),
    ("default_per_channel_weight_fake_quant", torch.randn(3, 4)),
    ("default_weight_fake_quant", torch.randn(3, 4)),
    ("default_float_qparams_observer", torch.randn(3, 4)),
])
def test_get_qparam_dict_matches_torch(name, data):
    ours = getattr(obs, name, None) or getattr(fq, name)
    theirs = getattr(tq, name)
    ours, theirs = ours(), theirs()
    ours(data)
    theirs(data)
    a, b = qu.get_qparam_dict(ours), tu.get_qparam_dict(theirs)
    assert list(a) == list(b)
    for key in a:
        if isinstance(b[key], torch.Tensor):
            assert torch.equal(a[key], b[key]) and a[key].dtype == b[key].dtype
        else:  # torchquant dtypes / qschemes compare equal to their torch aliases
            assert a[key] == b[key], key


CLASSIFIERS = ["activation_is_statically_quantized", "activation_is_dynamically_quantized",
               "activation_is_int8_quantized", "activation_is_int32_quantized",
               "weight_is_quantized", "weight_is_statically_quantized",
               "op_is_int8_dynamically_quantized", "get_quant_type"]
QCONFIGS = ["default_qconfig", "default_dynamic_qconfig", "float16_dynamic_qconfig",
            "float16_static_qconfig", "float_qparams_weight_only_qconfig",
            "float_qparams_weight_only_qconfig_4bit", "default_qat_qconfig",
            "default_dynamic_qat_qconfig", "per_channel_dynamic_qconfig",
            "default_symmetric_qnnpack_qconfig", "default_embedding_qat_qconfig"]


@pytest.mark.parametrize("qconfig", QCONFIGS)
def test_qconfig_classifiers_match_torch(qconfig):
    ours, theirs = getattr(qc, qconfig), getattr(tq, qconfig)
    for name in CLASSIFIERS:
        try:
            expected = getattr(tu, name)(theirs)
        except Exception:
            with pytest.raises(Exception):
                getattr(qu, name)(ours)
            continue
        assert getattr(qu, name)(ours) == expected, name
    a, b = qu.get_qconfig_dtypes(ours), tu.get_qconfig_dtypes(theirs)
    assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2]


def test_int_dtype_qconfig_classification():
    int16 = qc.QConfig(activation=obs.MinMaxObserver.with_args(dtype=torch.int16),
                       weight=obs.MinMaxObserver.with_args(dtype=torch.int8,
                                                           qscheme=torch.per_tensor_symmetric))
    assert qu.activation_is_statically_quantized(int16)
    assert qu.get_quant_type(int16) == QuantType.STATIC
    assert qu.weight_is_statically_quantized(int16)


def test_classifiers_need_a_qconfig():
    for name in CLASSIFIERS + ["get_qconfig_dtypes", "activation_dtype", "weight_dtype"]:
        with pytest.raises(AssertionError, match="qconfig must be provided"):
            getattr(qu, name)(None)


def test_get_quant_type_unrecognized():
    odd = qc.QConfig(activation=obs.PlaceholderObserver.with_args(dtype=torch.float32),
                     weight=obs.PlaceholderObserver.with_args(dtype=torch.float32))
    with pytest.raises(ValueError, match="Unrecognized dtype combination"):
        qu.get_quant_type(odd)


def test_parent_name():
    assert qu._parent_name("a.b.c") == tu._parent_name("a.b.c") == ("a.b", "c")
    assert qu._parent_name("c") == tu._parent_name("c") == ("", "c")


def test_quant_type_matches_torch():
    for ours, theirs in zip(QuantType, tq.QuantType):
        assert (ours.name, int(ours)) == (theirs.name, int(theirs))
        assert quant_type._get_quant_type_to_str(ours) == \
            torch.ao.quantization.quant_type._get_quant_type_to_str(theirs)
        assert quant_type._quant_type_from_str(quant_type._get_quant_type_to_str(ours)) is ours
    with pytest.raises(ValueError, match="Unknown QuantType"):
        quant_type._quant_type_from_str("int4")


def test_per_tensor_per_channel_predicates():
    assert qu.is_per_tensor(torch.per_tensor_symmetric) and qu.is_per_tensor(
        torchquant.per_tensor_affine)
    assert not qu.is_per_tensor(torchquant.per_channel_affine)
    assert qu.is_per_channel(torchquant.per_channel_affine_float_qparams)
    assert not qu.is_per_channel(None)
