"""FX graph mode quantization against torch.ao.quantization.quantize_fx (torch 2.13) as oracle.

Activations: the x86 default qconfig observes activations with ``reduce_range=True`` (0..127),
and the custom qconfigs below do the same, so torch's u8 x s8 kernels are exact even on
AVX2-only CPUs (see tests/conftest.py) and converted models are compared bit-exactly.
"""
from __future__ import annotations

import copy
import operator
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch.ao.quantization as ao
import torch.ao.quantization.quantize_fx as ao_fx

import torchquant.nn.intrinsic as nni
import torchquant.nn.intrinsic.qat as nniqat
import torchquant.nn.intrinsic.quantized as nniq
import torchquant.nn.quantized as nnq
import torchquant.nn.quantized.reference as nnqr
from torchquant.nn.quantized import _binary
from torchquant.quantization import observer as tq_observer
from torchquant.quantization import quantize_fx
from torchquant.quantization.fx.convert import quantize_per_tensor as fx_quantize_per_tensor
from torchquant.quantization.fx.custom_config import PrepareCustomConfig
from torchquant.quantization.qconfig import (QConfig, QConfigMapping,
                                             get_default_qat_qconfig_mapping,
                                             get_default_qconfig_mapping)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*reduce_range.*")
        yield


class ResidualCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(x))
        x = F.relu(torch.add(x, y))
        x = self.avg(self.pool(x))
        return self.fc(torch.flatten(x, 1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 5)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(self.relu(self.fc1(x)))))


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(12, 10) * 0.3)
        self.b1 = nn.Parameter(torch.randn(12) * 0.1)
        self.w2 = nn.Parameter(torch.randn(12, 12) * 0.3)

    def forward(self, x):
        h = F.relu(F.linear(x, self.w1, self.b1))
        g = F.linear(h, self.w2)
        return torch.cat([torch.add(h, g), h], 1).view(x.shape[0], -1)


class MixedOps(nn.Module):
    """mul / mul+relu of two tensors, linear + BatchNorm1d fusion, add with a scalar (shares the
    input observer), a fixed-qparams op and a non-tensor output."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)
        self.bn3 = nn.BatchNorm1d(8)

    def forward(self, x):
        y = torch.mul(self.fc1(x), self.fc2(x))
        y = torch.relu(y * self.bn3(self.fc3(x)))
        return torch.sigmoid(y + 1.0), x.size(0)


class ConvMix(nn.Module):
    """Conv-BN-ReLU modules mixed with functional F.conv2d (+ F.relu), cat and mean.
    (torch's own lowering needs F.conv2d's stride / padding / dilation as lists.)"""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.bn = nn.BatchNorm2d(6)
        self.relu = nn.ReLU()
        self.w = nn.Parameter(torch.randn(6, 3, 3, 3) * 0.3)
        self.b = nn.Parameter(torch.randn(6) * 0.1)
        self.w2 = nn.Parameter(torch.randn(6, 6, 1, 1) * 0.3)

    def forward(self, x):
        a = self.relu(self.bn(self.conv(x)))
        c = F.relu(F.conv2d(x, self.w, self.b, (1, 1), (0, 0), (1, 1), 1))
        d = F.conv2d(a, self.w2, None, (2, 2), (0, 0), (1, 1), 1)
        return torch.cat([a, c], 1).mean(), d


class SliceCat(nn.Module):
    """A slice (operator.getitem, no pattern: float) feeding cat, which observes it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.conv2 = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.cat([self.conv(x)[:, :4], self.conv2(x)], 1)


def _models():
    torch.manual_seed(0)
    cnn = ResidualCNN()
    for bn in (cnn.bn1, cnn.bn2):
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
    return {
        "cnn": (cnn.eval(), lambda: torch.rand(2, 3, 8, 8)),
        "mlp": (MLP().eval(), lambda: torch.randn(4, 16)),
        "functional": (Functional().eval(), lambda: torch.randn(4, 10)),
        "mixed": (MixedOps().eval(), lambda: torch.randn(4, 8)),
        "convmix": (ConvMix().eval(), lambda: torch.rand(2, 3, 8, 8)),
        "slicecat": (SliceCat().eval(), lambda: torch.rand(2, 3, 8, 8)),
    }


def _observer_placement(gm: torch.fx.GraphModule) -> list[tuple]:
    """(observer name, observed node, its users) in graph order, plus which observers share
    one instance."""
    modules = dict(gm.named_modules(remove_duplicate=False))
    observers = [n for n in gm.graph.nodes
                 if n.op == "call_module" and str(n.target).startswith("activation_post_process")]
    first_name_of = {}
    placement = []
    for n in observers:
        shared_with = first_name_of.setdefault(id(modules[str(n.target)]), str(n.target))
        placement.append((str(n.target), n.args[0].name, sorted(u.name for u in n.users),
                          shared_with))
    return placement


def _both(name, mapping_pair=None, calib_batches=4):
    model, make_input = _models()[name]
    ours_map, torch_map = mapping_pair or (get_default_qconfig_mapping("x86"),
                                           ao.get_default_qconfig_mapping("x86"))
    example = (make_input(),)
    ours = quantize_fx.prepare_fx(model, ours_map, example)
    theirs = ao_fx.prepare_fx(copy.deepcopy(model), torch_map, example)
    torch.manual_seed(1)
    for _ in range(calib_batches):
        x = make_input()
        ours(x)
        theirs(x)
    return model, make_input, ours, theirs


@pytest.mark.parametrize("name", ["cnn", "mlp", "functional", "mixed", "convmix", "slicecat"])
def test_prepare_observer_placement_matches_torch(name):
    _, _, ours, theirs = _both(name, calib_batches=1)
    assert _observer_placement(ours) == _observer_placement(theirs)


@pytest.mark.parametrize("name", ["cnn", "mlp", "functional", "mixed", "convmix", "slicecat"])
def test_convert_fx_matches_torch_bit_exactly(name):
    model, make_input, ours, theirs = _both(name)
    q_ours = quantize_fx.convert_fx(ours)
    q_theirs = ao_fx.convert_fx(theirs)
    torch.manual_seed(2)
    for _ in range(3):
        x = make_input()
        torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)
    # and it is a sensible quantization of the float model
    x = make_input()
    if name == "mixed":
        assert q_ours(x)[1] == 4
        return
    if name == "convmix":
        assert [type(m) for m in q_ours.children()] == [nniq.ConvReLU2d, nniq.ConvReLU2d,
                                                         nnq.Conv2d]
        return
    err = (q_ours(x) - model(x)).abs().max()
    assert err < 0.1 * model(x).abs().max() + 0.05


def test_user_model_unchanged_and_prepare_copies():
    model, make_input, ours, _ = _both("cnn", calib_batches=1)
    assert type(model.conv1) is nn.Conv2d and type(model.bn1) is nn.BatchNorm2d
    assert not any("activation_post_process" in n for n, _ in model.named_modules())
    assert ours.conv1 is not model.conv1


def test_converted_cnn_uses_torchquant_modules_and_ops():
    _, make_input, ours, theirs = _both("cnn")
    q = quantize_fx.convert_fx(ours)
    assert type(q.conv1) is nniq.ConvReLU2d
    assert type(q.conv2) is nnq.Conv2d
    assert type(q.fc) is nnq.Linear
    functions = [n.target for n in q.graph.nodes if n.op == "call_function"]
    assert functions.count(fx_quantize_per_tensor) == 1          # only the model input
    assert _binary.add in functions and torch.add not in functions
    methods = [n.target for n in q.graph.nodes if n.op == "call_method"]
    assert methods == ["dequantize"]                              # only the model output
    # the torch.ao oracle has the same structure with torch's quantized modules
    q_theirs = ao_fx.convert_fx(theirs)
    ours_modules = {n: type(m).__name__ for n, m in q.named_children()}
    theirs_modules = {n: type(m).__name__ for n, m in q_theirs.named_children()}
    assert ours_modules == theirs_modules


def test_converted_functional_model_lowers_linear_and_add():
    _, make_input, ours, _ = _both("functional")
    q = quantize_fx.convert_fx(ours)
    module_types = sorted(type(m).__name__ for _, m in q.named_children())
    assert module_types == ["Linear", "LinearReLU"]
    assert all(type(m) in (nnq.Linear, nniq.LinearReLU) for _, m in q.named_children())
    functions = [n.target for n in q.graph.nodes if n.op == "call_function"]
    assert F.linear not in functions and _binary.add in functions and _binary.cat in functions


def test_converted_mixed_ops_lower_to_torchquant_ops():
    _, make_input, ours, _ = _both("mixed")
    q = quantize_fx.convert_fx(ours)
    assert type(q.fc3) is nnq.Linear                      # linear + bn1d folded at fusion
    functions = [n.target for n in q.graph.nodes if n.op == "call_function"]
    assert functions.count(_binary.mul) == 2 and _binary.add_scalar in functions
    assert operator.add not in functions and operator.mul not in functions


def test_fuse_fx_module_types_and_numerics_match_torch():
    model, make_input, _, _ = _both("cnn", calib_batches=0)
    fused = quantize_fx.fuse_fx(model)
    fused_theirs = ao_fx.fuse_fx(copy.deepcopy(model))
    assert type(fused.conv1) is nni.ConvReLU2d and type(fused.conv2) is nn.Conv2d
    assert [type(m).__name__ for _, m in fused.named_children()] == \
        [type(m).__name__ for _, m in fused_theirs.named_children()]
    x = make_input()
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused(x), fused_theirs(x), rtol=0, atol=0)


def _reduce_range_qconfigs():
    ours = QConfig(activation=tq_observer.MinMaxObserver.with_args(reduce_range=True),
                   weight=tq_observer.default_weight_observer)
    theirs = ao.QConfig(activation=ao.MinMaxObserver.with_args(reduce_range=True),
                        weight=ao.default_weight_observer)
    return ours, theirs


def test_qconfig_mapping_overrides_and_skipped_layer_match_torch():
    ours_q, theirs_q = _reduce_range_qconfigs()
    # fc1 + relu are fused: both members need the same object-type qconfig (else LookupError)
    ours_map = (get_default_qconfig_mapping("x86").set_object_type(nn.Linear, ours_q)
                .set_object_type(nn.ReLU, ours_q).set_module_name("fc2", None))
    theirs_map = (ao.get_default_qconfig_mapping("x86").set_object_type(nn.Linear, theirs_q)
                  .set_object_type(nn.ReLU, theirs_q).set_module_name("fc2", None))
    model, make_input, ours, theirs = _both("mlp", (ours_map, theirs_map))
    assert _observer_placement(ours) == _observer_placement(theirs)
    assert type(ours.activation_post_process_0) is tq_observer.MinMaxObserver
    with pytest.warns(UserWarning, match="fc2"):
        q_ours = quantize_fx.convert_fx(ours)
    q_theirs = ao_fx.convert_fx(theirs)
    # fc2 (fused with its F.relu) stays a float nni.LinearReLU, as in torch
    assert type(q_ours.fc2) is nni.LinearReLU and type(q_ours.fc1) is nniq.LinearReLU
    assert [type(m).__name__ for m in q_ours.children()] == \
        [type(m).__name__ for m in q_theirs.children()]
    x = make_input()
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)


def test_module_name_regex_and_object_type_order_precedence():
    ours_q, theirs_q = _reduce_range_qconfigs()
    # regex beats object type; module_name_object_type_order beats everything: the second
    # torch.add / F.linear call at the top level ("" scope) gets no qconfig.
    ours_map = (QConfigMapping().set_global(ours_q)
                .set_module_name_object_type_order("", F.linear, 1, None))
    theirs_map = (ao.QConfigMapping().set_global(theirs_q)
                  .set_module_name_object_type_order("", F.linear, 1, None))
    _, make_input, ours, theirs = _both("functional", (ours_map, theirs_map))
    assert _observer_placement(ours) == _observer_placement(theirs)
    q_ours, q_theirs = quantize_fx.convert_fx(ours), ao_fx.convert_fx(theirs)
    x = make_input()
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)

    ours_map = (QConfigMapping().set_global(ours_q).set_object_type(nn.Linear, None)
                .set_module_name_regex("fc[13]", ours_q))
    theirs_map = (ao.QConfigMapping().set_global(theirs_q).set_object_type(nn.Linear, None)
                  .set_module_name_regex("fc[13]", theirs_q))
    _, make_input, ours, theirs = _both("mlp", (ours_map, theirs_map))
    assert _observer_placement(ours) == _observer_placement(theirs)
    q_ours, q_theirs = quantize_fx.convert_fx(ours), ao_fx.convert_fx(theirs)
    # fc2 + F.relu is fused to LinearReLU, whose type has no object-type entry (nn.Linear's
    # None is not propagated since ReLU's entry differs): it takes the global qconfig
    assert type(q_ours.fc1) is nniq.LinearReLU and type(q_ours.fc2) is nniq.LinearReLU
    assert type(q_ours.fc3) is nnq.Linear
    assert [type(m).__name__ for m in q_ours.children()] == \
        [type(m).__name__ for m in q_theirs.children()]
    x = make_input()
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)


def test_convert_to_reference_fx_keeps_reference_modules_and_qdq_nodes():
    model, make_input, ours, theirs = _both("cnn")
    ref = quantize_fx.convert_to_reference_fx(ours)
    assert type(ref.conv1) is nni.ConvReLU2d and type(ref.conv1[0]) is nnqr.Conv2d
    assert type(ref.conv2) is nnqr.Conv2d and type(ref.fc) is nnqr.Linear
    functions = [n.target for n in ref.graph.nodes if n.op == "call_function"]
    assert functions.count(fx_quantize_per_tensor) == 8
    assert torch.add in functions
    ref_theirs = ao_fx.convert_to_reference_fx(theirs)
    x = make_input()
    # both reference models run float ops on dequantized values: same math, same qparams
    torch.testing.assert_close(ref(x), ref_theirs(x), rtol=0, atol=1e-6)
    lowered = quantize_fx.convert_fx(ours)
    scale = float(lowered.fc.scale)
    assert (ref(x) - lowered(x)).abs().max() <= 2 * scale


def test_prepare_qat_fx_swaps_to_qat_modules_and_converts():
    torch.manual_seed(0)
    model = ResidualCNN().train()
    example = (torch.rand(2, 3, 8, 8),)
    ours = quantize_fx.prepare_qat_fx(model, get_default_qat_qconfig_mapping("x86"), example)
    theirs = ao_fx.prepare_qat_fx(copy.deepcopy(model), ao.get_default_qat_qconfig_mapping("x86"),
                                  example)
    assert type(ours.conv1) is nniqat.ConvBnReLU2d and type(ours.conv2) is nniqat.ConvBn2d
    assert [(a, b, c) for a, b, c, _ in _observer_placement(ours)] == \
        [(a, b, c) for a, b, c, _ in _observer_placement(theirs)]
    for _ in range(2):
        x = torch.rand(2, 3, 8, 8)
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    ours.eval()
    theirs.eval()
    q = quantize_fx.convert_fx(ours)
    q_theirs = ao_fx.convert_fx(theirs)
    assert type(q.conv1) is nniq.ConvReLU2d and type(q.conv2) is nnq.Conv2d
    x = torch.rand(2, 3, 8, 8)
    torch.testing.assert_close(q(x), q_theirs(x), rtol=0, atol=0)


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Branchy()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(self.inner(x))


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_untraceable_model_error_names_module_and_fix():
    model = Untraceable().eval()
    with pytest.raises(RuntimeError, match="'inner' \\(Branchy\\).*non_traceable"):
        quantize_fx.prepare_fx(model, get_default_qconfig_mapping("x86"), (torch.randn(2, 4),))
    custom = PrepareCustomConfig().set_non_traceable_module_names(["inner"])
    prepared = quantize_fx.prepare_fx(model, get_default_qconfig_mapping("x86"),
                                      (torch.randn(2, 4),), prepare_custom_config=custom)
    assert "inner" in dict(prepared.named_children())


def test_bad_inputs_raise_clear_errors():
    model = MLP().eval()
    mapping = get_default_qconfig_mapping("x86")
    with pytest.raises(ValueError, match="example_inputs"):
        quantize_fx.prepare_fx(model, mapping, None)
    with pytest.raises(ValueError, match="qconfig_mapping"):
        quantize_fx.prepare_fx(model, None, (torch.randn(1, 16),))
    with pytest.raises(ValueError, match="eval mode"):
        quantize_fx.prepare_fx(MLP().train(), mapping, (torch.randn(1, 16),))
    with pytest.raises(ValueError, match="never prepared"):
        quantize_fx.convert_fx(torch.fx.symbolic_trace(model))
    prepared = quantize_fx.prepare_fx(model, mapping, (torch.randn(1, 16),))
    other = QConfigMapping().set_global(_reduce_range_qconfigs()[0])
    with pytest.raises(ValueError, match="differs"):
        quantize_fx.convert_fx(prepared, qconfig_mapping=other)


def test_fused_members_with_different_qconfigs_raise_lookup_error():
    ours_q, _ = _reduce_range_qconfigs()
    mapping = QConfigMapping().set_global(ours_q).set_object_type(nn.ReLU, None)
    with pytest.raises(LookupError, match="same qconfigs"):
        quantize_fx.prepare_fx(MLP().eval(), mapping.set_object_type(nn.Linear, ours_q),
                               (torch.randn(1, 16),))


def test_plain_dict_qconfig_mapping_is_accepted_with_warning():
    ours_q, _ = _reduce_range_qconfigs()
    with pytest.warns(FutureWarning):
        prepared = quantize_fx.prepare_fx(MLP().eval(), {"": ours_q}, (torch.randn(1, 16),))
    assert hasattr(prepared, "activation_post_process_0")


def _linear_only_backend_configs(input_constraint_scale_min=None):
    """The same one-pattern BackendConfig (only nn.Linear) for torchquant and torch.ao."""
    import torch.ao.nn.quantized.reference as ao_nnqr
    import torch.ao.quantization.backend_config as ao_bc
    from torchquant.quantization import backend_config as tq_bc

    def build(bc, ref_linear):
        input_dtype = torch.quint8 if input_constraint_scale_min is None else \
            bc.DTypeWithConstraints(dtype=torch.quint8,
                                    scale_min_lower_bound=input_constraint_scale_min)
        dtype_config = bc.DTypeConfig(input_dtype=input_dtype, output_dtype=torch.quint8,
                                      weight_dtype=torch.qint8, bias_dtype=torch.float)
        linear = (bc.BackendPatternConfig(nn.Linear)
                  .set_observation_type(bc.ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
                  .add_dtype_config(dtype_config).set_root_module(nn.Linear)
                  .set_reference_quantized_module(ref_linear))
        return bc.BackendConfig("linear_only").set_backend_pattern_config(linear)

    return build(tq_bc, nnqr.Linear), build(ao_bc, ao_nnqr.Linear)


def _prepare_both_with_backend(ours_bc, theirs_bc):
    torch.manual_seed(0)
    model = MLP().eval()
    example = (torch.randn(4, 16),)
    ours_q, theirs_q = _reduce_range_qconfigs()
    ours = quantize_fx.prepare_fx(model, QConfigMapping().set_global(ours_q), example,
                                  backend_config=ours_bc)
    theirs = ao_fx.prepare_fx(copy.deepcopy(model), ao.QConfigMapping().set_global(theirs_q),
                              example, backend_config=theirs_bc)
    for _ in range(3):
        x = torch.randn(4, 16)
        ours(x)
        theirs(x)
    return ours, theirs


def test_user_backend_config_limits_what_is_quantized_like_torch():
    ours_bc, theirs_bc = _linear_only_backend_configs()
    ours, theirs = _prepare_both_with_backend(ours_bc, theirs_bc)
    assert _observer_placement(ours) == _observer_placement(theirs)
    assert type(ours.fc1) is nn.Linear                 # no fusion patterns in this config
    q_ours = quantize_fx.convert_fx(ours, backend_config=ours_bc)
    q_theirs = ao_fx.convert_fx(theirs, backend_config=theirs_bc)
    assert [type(m).__name__ for m in q_ours.children()] == \
        [type(m).__name__ for m in q_theirs.children()]
    assert all(type(getattr(q_ours, n)) is nnq.Linear for n in ("fc1", "fc2", "fc3"))
    x = torch.randn(4, 16)
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)


def test_dtype_constraint_mismatch_leaves_pattern_float_with_warning():
    # the observers' eps (float32 eps) is below the 2**-12 scale lower bound: not satisfied
    ours_bc, theirs_bc = _linear_only_backend_configs(input_constraint_scale_min=2 ** -12)
    with pytest.warns(UserWarning, match="fc1.*left in float"):
        ours, theirs = _prepare_both_with_backend(ours_bc, theirs_bc)
    assert _observer_placement(ours) == _observer_placement(theirs) == []
    q = quantize_fx.convert_fx(ours, backend_config=ours_bc)
    assert type(q.fc1) is nn.Linear


@pytest.mark.parametrize("name", ["cnn", "functional"])
def test_converted_model_exports(name):
    _, make_input, ours, _ = _both(name, calib_batches=2)
    q = quantize_fx.convert_fx(ours)
    x = make_input()
    exported = torch.export.export(q, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("torchquant.") for t in targets)
    torch.testing.assert_close(exported.module()(x), q(x), rtol=0, atol=0)


def test_converted_model_compiles_fullgraph():
    _, make_input, ours, _ = _both("mlp", calib_batches=2)
    q = quantize_fx.convert_fx(ours)
    x = make_input()
    torch.testing.assert_close(torch.compile(q, fullgraph=True)(x), q(x), rtol=0, atol=0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return F.relu(torch.add(self.conv(x), x))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.block1 = Block()
        self.block2 = Block()

    def forward(self, x):
        return self.block2(self.block1(self.stem(x)))


@pytest.mark.parametrize("disable", ["block2", "block1.conv"])
def test_module_name_applies_to_submodule_functions_like_torch(disable):
    # a module_name entry covers the functional ops traced inside that module's forward
    torch.manual_seed(0)
    model = Nested().eval()
    example = (torch.rand(2, 3, 6, 6),)
    ours_map = get_default_qconfig_mapping("x86").set_module_name(disable, None)
    theirs_map = ao.get_default_qconfig_mapping("x86").set_module_name(disable, None)
    ours = quantize_fx.prepare_fx(model, ours_map, example)
    theirs = ao_fx.prepare_fx(copy.deepcopy(model), theirs_map, example)
    assert _observer_placement(ours) == _observer_placement(theirs)
    for _ in range(3):
        x = torch.rand(2, 3, 6, 6)
        ours(x)
        theirs(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q_ours = quantize_fx.convert_fx(ours)
    q_theirs = ao_fx.convert_fx(theirs)
    assert [type(m).__name__ for _, m in q_ours.named_modules()][1:] == \
        [type(m).__name__ for _, m in q_theirs.named_modules()][1:]
    x = torch.rand(2, 3, 6, 6)
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)


# ---- a None qconfig for a function; keep_original_weights (issue 28) ------------------------

class _FunctionalLinearReLU(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(4, 8, generator=g))
        self.b = nn.Parameter(torch.randn(4, generator=g))

    def forward(self, x):
        return F.relu(F.linear(x, self.w, self.b))


def _convert_both(model, ours_mapping, theirs_mapping, x, **convert_kwargs):
    ours = quantize_fx.prepare_fx(copy.deepcopy(model), ours_mapping, (x,))
    theirs = ao_fx.prepare_fx(copy.deepcopy(model), theirs_mapping, (x,))
    ours(x), theirs(x)
    return (quantize_fx.convert_fx(ours, **convert_kwargs),
            ao_fx.convert_fx(theirs, **convert_kwargs))


def test_none_qconfig_for_a_function_keeps_it_float_as_torch():
    """Each node of a fused pattern uses its own qconfig: F.linear with None stays float (its
    weight unobserved), the ReLU after it keeps the global qconfig's output quantization."""
    model = _FunctionalLinearReLU().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    ours, theirs = _convert_both(
        model, get_default_qconfig_mapping("x86").set_object_type(F.linear, None),
        ao.get_default_qconfig_mapping("x86").set_object_type(F.linear, None), x)
    assert not [name for name, _ in ours.named_children()]
    assert any(n.op == "call_function" and n.target is F.linear for n in ours.graph.nodes)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


def test_keep_original_weights_keeps_the_functional_float_weights():
    model = _FunctionalLinearReLU().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    ours, theirs = _convert_both(model, get_default_qconfig_mapping("x86"),
                                 ao.get_default_qconfig_mapping("x86"), x,
                                 keep_original_weights=True)
    (ours_kept,) = ours.original_weights_lookup.values()
    (theirs_kept,) = theirs.original_weights_lookup.values()
    for a, b in zip(ours_kept, theirs_kept):
        assert torch.equal(a, b)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    prepared = quantize_fx.prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"),
                                      (x,))
    prepared(x)
    plain = quantize_fx.convert_fx(prepared)
    assert not hasattr(plain, "original_weights_lookup")


def _prepare_onednn(model, x, calibration=None):
    """``model`` prepared with the x86 qconfig (reduce_range activations: torch's oneDNN
    kernels are exact on every CPU) and the oneDNN backend config, calibrated on
    ``calibration`` (default ``x``)."""
    from torchquant.quantization.backend_config import get_onednn_backend_config
    from torchquant.quantization.qconfig import get_default_qconfig

    prepared = quantize_fx.prepare_fx(copy.deepcopy(model),
                                      QConfigMapping().set_global(get_default_qconfig("x86")),
                                      (x,), backend_config=get_onednn_backend_config())
    prepared(x if calibration is None else calibration)
    return quantize_fx.convert_fx(prepared, backend_config=get_onednn_backend_config())


def _onednn_both(model, x):
    """(ours, torch.ao's output, torch.ao's state_dict keys) for :func:`_prepare_onednn`;
    torch.ao's oneDNN fused kernels are packed and run with its engine set to onednn."""
    from torch.ao.quantization.backend_config import get_onednn_backend_config as ao_onednn

    theirs = ao_fx.prepare_fx(copy.deepcopy(model),
                              ao.QConfigMapping().set_global(ao.get_default_qconfig("x86")),
                              (x,), backend_config=ao_onednn())
    theirs(x)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn"
    try:
        theirs = ao_fx.convert_fx(theirs, backend_config=ao_onednn())
        expected, keys = theirs(x), list(theirs.state_dict())
    finally:
        torch.backends.quantized.engine = engine
    return _prepare_onednn(model, x), expected, keys, [type(m).__name__ for m in theirs.children()]


class _LinearActivations(nn.Module):
    """Linear + LeakyReLU and Linear + Tanh: fused modules of the oneDNN backend config."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act1 = nn.Linear(8, 8), nn.LeakyReLU(0.1)
        self.fc2, self.act2 = nn.Linear(8, 4), nn.Tanh()

    def forward(self, x):
        return self.act2(self.fc2(self.act1(self.fc1(x))))


def test_onednn_fused_linear_activations_lower_as_torch():
    """With the oneDNN backend config, Linear + LeakyReLU / Tanh become the quantized
    LinearLeakyReLU / LinearTanh (the pattern table's FX rows): torch.ao's types, state_dict
    keys and outputs."""
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    ours, expected, keys, their_types = _onednn_both(_LinearActivations().eval(), x)
    assert [type(m) for m in ours.children()] == [nniq.LinearLeakyReLU, nniq.LinearTanh]
    assert their_types == ["LinearLeakyReLU", "LinearTanh"]
    assert list(ours.state_dict()) == keys
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=0)


class _ConvAdds(nn.Module):
    """conv + add + ReLU whose other addend is computed after the conv, and conv + BN + add
    (``torch.add``, the conv's input as the other addend): oneDNN's ConvAdd fusions."""

    def __init__(self):
        super().__init__()
        self.conv, self.side = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 1)
        self.relu, self.conv2, self.bn = nn.ReLU(), nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.relu(self.conv(x) + self.side(x))
        return torch.add(y, self.bn(self.conv2(y)))


def test_onednn_conv_add_fuses_and_lowers_as_torch():
    """fuse_fx matches the oneDNN config's conv + add patterns (MatchAllNode for the other
    addend, the config's root-node / extra-inputs getters), prepare observes both inputs and
    convert lowers to ConvAdd2d / ConvAddReLU2d (the table's two-input FX rows): torch.ao's
    graph, state_dict keys (torch.ao orders its modules by first use in the fused graph, so
    the keys are compared as a set) and outputs, also after a state_dict reload."""
    from torchquant.quantization.backend_config import get_onednn_backend_config

    torch.manual_seed(0)
    model = _ConvAdds().eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    fused = quantize_fx.fuse_fx(copy.deepcopy(model), backend_config=get_onednn_backend_config())
    assert [type(m) for m in fused.children()] == [nni.ConvAddReLU2d, nn.Conv2d, nni.ConvAdd2d]
    calls = [n for n in fused.graph.nodes if n.op == "call_module"]
    assert [(n.target, [a.name for a in n.args]) for n in calls] == [
        ("side", ["x"]), ("conv", ["x", "side"]), ("conv2", ["conv", "conv"])]
    ours, expected, keys, _ = _onednn_both(model, x)
    assert {name: type(m) for name, m in ours.named_children()} == {
        "conv": nniq.ConvAddReLU2d, "side": nnq.Conv2d, "conv2": nniq.ConvAdd2d}
    assert sorted(ours.state_dict()) == sorted(keys)
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=0)
    # a model calibrated on other data takes this one's state dict and computes its outputs
    other = _prepare_onednn(model, x, calibration=3 * x)
    assert not torch.equal(other(x), expected)
    other.load_state_dict(ours.state_dict())
    torch.testing.assert_close(other(x), expected, rtol=0, atol=0)


def test_a_reference_module_left_unlowered_is_reported_with_its_reason(monkeypatch):
    """Where the lowering leaves a quantized pattern's reference module (here: made to lower
    nothing), convert_fx's coverage says which module and why, as a warning-level line."""
    from torchquant.quantization.summary import summary as coverage

    model = MLP().eval()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    prepared = quantize_fx.prepare_fx(model, get_default_qconfig_mapping("x86"), (x,))
    prepared(x)
    monkeypatch.setattr(quantize_fx, "lower_to_torchquant", lambda gm, backend_config: gm)
    with pytest.warns(UserWarning, match="no module was quantized"):
        converted = quantize_fx.convert_fx(prepared)
    rows = coverage(converted).float_modules
    assert [row.name for row in rows] == ["fc1", "fc2", "fc3"]
    assert all("runs as its reference module" in row.reason and not row.by_design
               for row in rows)


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.matmul(self.q(x), self.k(x).transpose(0, 1))


def test_matmul_of_two_quantized_tensors_lowers_as_torch():
    """``torch.matmul`` between dequantized inputs and a quantize becomes the quantized matmul
    (torch.ao's ``quantized.matmul``; the pattern table's "matmul" FX row), not a float
    matmul between dequantize and quantize."""
    model = _Attention().eval()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    ours, theirs = _convert_both(model, get_default_qconfig_mapping("x86"),
                                 ao.get_default_qconfig_mapping("x86"), x)
    targets = [n.target for n in ours.graph.nodes if n.op == "call_function"]
    assert _binary.matmul in targets and torch.matmul not in targets
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
