"""prepare_pt2e / prepare_qat_pt2e / convert_pt2e against torchao 0.18's PT2E flow.

Each model is exported twice from one seeded float model; torchao's flow runs with torchao's
quantizer on one export, torchquant's with torchquant's quantizer on the other, both see the same
calibration batches.  Checked: the observers (in graph order) are of the same class and compute
the same scale / zero point; the converted graphs have the same number of quantize and of
dequantize ops; the converted outputs agree bit for bit, except where noted in the test.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

from _models import MODELS
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchquant.quantization.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer
from torchquant.quantization.quantizer import x86_inductor_quantizer as tq_x86
from torchquant.quantization.quantizer import xnnpack_quantizer as tq_xnn
from torchquant.quantization import observer as tq_obs

ao_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ao_xnn = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
ao_x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")

# torchao warns "XNNPACKQuantizer is deprecated!" on every construction
pytestmark = pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated")




@pytest.fixture(autouse=True, scope="module")
def _cache_torchao_patterns():
    """torchao re-exports its conv+bn patterns (several torch.export calls) on every QAT
    prepare / convert; the patterns depend only on the pattern function's code and closure and
    the example shapes, so the oracle reuses them across calls (a speed-up of the oracle only:
    each call gets a fresh copy)."""
    import importlib

    owners = [importlib.import_module(name) for name in (
        "torchao.quantization.pt2e.utils", "torchao.quantization.pt2e.qat_utils",
        "torchao.testing.pt2e._xnnpack_quantizer_utils")]
    originals = [getattr(o, "_get_aten_graph_module_for_pattern") for o in owners]
    cache: dict = {}

    def wrap(original):
        def cached(pattern, example_inputs, is_cuda=False, **kwargs):
            fn = getattr(pattern, "fn", None)
            if fn is None or not all(isinstance(v, torch.Tensor) for v in kwargs.values()):
                return original(pattern, example_inputs, is_cuda, **kwargs)
            # kwargs are example tensors: only their names / shapes / dtypes shape the pattern
            key = (fn.__code__, tuple(c.cell_contents for c in fn.__closure__ or ()),
                   tuple(tuple(x.shape) for x in example_inputs), is_cuda,
                   tuple(sorted((k, tuple(v.shape), v.dtype) for k, v in kwargs.items())))
            try:
                hash(key)
            except TypeError:
                return original(pattern, example_inputs, is_cuda, **kwargs)
            if key not in cache:
                cache[key] = original(pattern, example_inputs, is_cuda, **kwargs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                return copy.deepcopy(cache[key])
        return cached

    for owner, original in zip(owners, originals):
        owner._get_aten_graph_module_for_pattern = wrap(original)
    yield
    for owner, original in zip(owners, originals):
        owner._get_aten_graph_module_for_pattern = original


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _float_model(name: str) -> tuple[nn.Module, tuple]:
    cls, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    for m in model.modules():  # non-trivial BN statistics, so BN folding is exercised
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model, make_inputs()


def _export(model: nn.Module, inputs: tuple) -> torch.fx.GraphModule:
    return torch.export.export(model, inputs).module()


def _calibration(inputs: tuple, n: int = 4) -> list[tuple]:
    gen = torch.Generator().manual_seed(1)
    return [tuple(torch.randn(x.shape, generator=gen) * 2 for x in inputs) for _ in range(n)]


def _observer_nodes(gm: torch.fx.GraphModule) -> list[nn.Module]:
    mods = dict(gm.named_modules(remove_duplicate=False))
    return [mods[n.target] for n in gm.graph.nodes
            if n.op == "call_module" and n.target.startswith("activation_post_process_")]


def _count(gm: torch.fx.GraphModule, word: str) -> int:
    """call_function nodes whose op name contains ``word`` as a whole op-name part."""
    count = 0
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        name = str(n.target).split(".")[-2] if "." in str(n.target) else str(n.target)
        if name.startswith(word):
            count += 1
    return count


def _prepare_both(name, ao_quantizer, tq_quantizer, qat=False):
    model, inputs = _float_model(name)
    # exports share the model's parameter tensors: one copy each, so training one flow does not
    # move the other's weights
    theirs_in = _export(copy.deepcopy(model), inputs)
    ours_in = _export(copy.deepcopy(model), inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao: "XNNPACKQuantizer is deprecated!"
        if qat:
            theirs = ao_pt2e.prepare_qat_pt2e(theirs_in, ao_quantizer)
        else:
            theirs = ao_pt2e.prepare_pt2e(theirs_in, ao_quantizer)
    ours = (prepare_qat_pt2e if qat else prepare_pt2e)(ours_in, tq_quantizer)
    return model, inputs, theirs, ours


def _assert_same_observers(theirs, ours):
    obs_theirs, obs_ours = _observer_nodes(theirs), _observer_nodes(ours)
    assert [type(o).__name__ for o in obs_ours] == [type(o).__name__ for o in obs_theirs]
    assert len({id(o) for o in obs_ours}) == len({id(o) for o in obs_theirs})  # same sharing
    for a, b in zip(obs_theirs, obs_ours):
        if getattr(a, "is_dynamic", False) or not hasattr(a, "calculate_qparams"):
            continue
        if type(a).__name__ == "PlaceholderObserver":
            continue
        sa, za = a.calculate_qparams()
        sb, zb = b.calculate_qparams()
        assert torch.equal(torch.as_tensor(sb).float(), torch.as_tensor(sa).float()), (a, b)
        assert torch.equal(torch.as_tensor(zb).long(), torch.as_tensor(za).long()), (a, b)


def _assert_same_qdq_counts(theirs, ours):
    # torchao: quantized_decomposed.{quantize,dequantize}_per_{tensor,channel}[.tensor];
    # torchquant: torchquant.{quantize,dequantize}_per_{tensor,channel}, and for dynamic specs
    # quantize_dynamic_per_tensor (qparams and codes in one op) with the dequantize written as
    # (codes - zero_point) * scale on the 0-d qparams it returns.
    q_theirs = _count(theirs, "quantize_per")
    q_ours = _count(ours, "quantize_per") + _count(ours, "quantize_dynamic_per_tensor")
    assert q_ours == q_theirs
    dq_theirs_static = sum(
        1 for n in theirs.graph.nodes if n.op == "call_function"
        and "dequantize_per" in str(n.target) and not str(n.target).endswith(".tensor"))
    assert _count(ours, "dequantize_per") == dq_theirs_static
    assert _count(ours, "quantize_dynamic_per_tensor") == sum(
        1 for n in theirs.graph.nodes if n.op == "call_function"
        and "dequantize_per_tensor.tensor" in str(n.target))


def _outputs(gm, inputs):
    out = gm(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run_flow(name, ao_quantizer, tq_quantizer):
    model, inputs, theirs, ours = _prepare_both(name, ao_quantizer, tq_quantizer)
    for batch in _calibration(inputs):
        theirs(*batch)
        ours(*batch)
    _assert_same_observers(theirs, ours)
    conv_theirs, conv_ours = ao_pt2e.convert_pt2e(theirs), convert_pt2e(ours)
    _assert_same_qdq_counts(conv_theirs, conv_ours)
    return model, inputs, conv_theirs, conv_ours


def _sqnr(ref: torch.Tensor, x: torch.Tensor) -> float:
    return (20 * torch.log10(ref.norm() / (ref - x).norm().clamp_min(1e-30))).item()


# --------------------------------------------------------------------------------------------
# static PTQ against torchao
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("name", ["conv_bn_relu", "mlp", "add_mul_cat"])
def test_xnnpack_static_bit_exact(name, per_channel):
    _, inputs, theirs, ours = _run_flow(
        name, ao_xnn.XNNPACKQuantizer().set_global(
            ao_xnn.get_symmetric_quantization_config(is_per_channel=per_channel)),
        tq_xnn.XNNPACKQuantizer().set_global(
            tq_xnn.get_symmetric_quantization_config(is_per_channel=per_channel)))
    for batch in [inputs] + _calibration(inputs, 2):
        for a, b in zip(_outputs(theirs, batch), _outputs(ours, batch)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_xnnpack_static_residual(per_channel):
    """Same qparams, q/dq nodes and outputs, bit for bit.  This model's adaptive average pool
    makes averages of integer multiples of one scale, so ``x / scale`` sits on .5 ties, where
    torchao's decomposed quantize (``round(x * (1/scale)) + zero_point``) and torch's own
    quantize kernel (``round(fma(x, 1/scale, zero_point))``) differ by a code; PT2E graphs
    quantize with torchao's rounding (they used torch's, a code off there)."""
    model, inputs, theirs, ours = _run_flow(
        "residual", ao_xnn.XNNPACKQuantizer().set_global(
            ao_xnn.get_symmetric_quantization_config(is_per_channel=per_channel)),
        tq_xnn.XNNPACKQuantizer().set_global(
            tq_xnn.get_symmetric_quantization_config(is_per_channel=per_channel)))
    for batch in [inputs] + _calibration(inputs, 2):
        a, b = _outputs(theirs, batch)[0], _outputs(ours, batch)[0]
        assert torch.equal(a, b)
        assert _sqnr(model(*batch), b) > 20


@pytest.mark.parametrize("name", ["conv_bn_relu", "mlp", "add_mul_cat", "residual", "pooling",
                                  "linear_binary"])
def test_x86_inductor_static(name):
    model, inputs, theirs, ours = _run_flow(
        name, ao_x86.X86InductorQuantizer().set_global(
            ao_x86.get_default_x86_inductor_quantization_config()),
        tq_x86.X86InductorQuantizer().set_global(
            tq_x86.get_default_x86_inductor_quantization_config()))
    for batch in [inputs] + _calibration(inputs, 2):
        for a, b in zip(_outputs(theirs, batch), _outputs(ours, batch)):
            assert torch.equal(a, b), name


# --------------------------------------------------------------------------------------------
# dynamic
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_xnnpack_dynamic_linear(per_channel):
    """Dynamic activations: the qparams are picked per call by torchao's rule (its float32
    ``choose_qparams``, not torch's double-precision dynamic rule, whose scales differed in the
    last bits): the outputs are torchao's, bit for bit."""
    model, inputs, theirs, ours = _run_flow(
        "mlp", ao_xnn.XNNPACKQuantizer().set_global(
            ao_xnn.get_symmetric_quantization_config(is_per_channel=per_channel,
                                                     is_dynamic=True)),
        tq_xnn.XNNPACKQuantizer().set_global(
            tq_xnn.get_symmetric_quantization_config(is_per_channel=per_channel,
                                                     is_dynamic=True)))
    assert _count(ours, "quantize_dynamic_per_tensor") == 4
    for batch in [inputs] + _calibration(inputs, 2):
        a, b = _outputs(theirs, batch)[0], _outputs(ours, batch)[0]
        assert torch.equal(a, b)
        assert _sqnr(model(*batch), b) > 20


# --------------------------------------------------------------------------------------------
# graph form
# --------------------------------------------------------------------------------------------

def test_weights_folded_to_integer_constants():
    model, inputs = _float_model("mlp")
    gm = prepare_pt2e(_export(model, inputs), tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config(is_per_channel=True)))
    gm(*inputs)
    folded = convert_pt2e(copy.deepcopy(gm))
    unfolded = convert_pt2e(gm, fold_quantize=False)
    dq_weights = [n for n in folded.graph.nodes
                  if n.target is torch.ops.torchquant.dequantize_per_channel.default]
    assert len(dq_weights) == 4
    for dq in dq_weights:
        const = dq.args[0]
        assert const.op == "get_attr"
        assert getattr(folded, const.target).dtype == torch.int8
    assert not any(n.op == "call_module" for n in folded.graph.nodes
                   if n.target != "_guards_fn")
    assert _count(unfolded, "quantize_per_channel") == 4
    assert torch.equal(folded(*inputs), unfolded(*inputs))


def test_observers_are_submodules_and_train_eval_raise():
    model, inputs = _float_model("conv_bn_relu")
    gm = prepare_pt2e(_export(model, inputs), tq_x86.X86InductorQuantizer().set_global(
        tq_x86.get_default_x86_inductor_quantization_config()))
    names = [n.target for n in gm.graph.nodes if n.op == "call_module"
             and n.target != "_guards_fn"]
    assert names and all(t.startswith("activation_post_process_") for t in names)
    assert isinstance(gm.activation_post_process_0, tq_obs.ObserverBase)
    with pytest.raises(NotImplementedError, match="move_exported_model_to_eval"):
        gm.eval()
    with pytest.raises(NotImplementedError, match="move_exported_model_to_train"):
        gm.train()
    # BN folded into the conv, as torchao does before annotating
    assert not any("batch_norm" in str(n.target) for n in gm.graph.nodes)


# --------------------------------------------------------------------------------------------
# QAT
# --------------------------------------------------------------------------------------------

def test_qat_mlp_trains_and_converts_like_torchao():
    model, inputs, theirs, ours = _prepare_both(
        "mlp", ao_xnn.XNNPACKQuantizer().set_global(
            ao_xnn.get_symmetric_quantization_config(is_qat=True)),
        tq_xnn.XNNPACKQuantizer().set_global(
            tq_xnn.get_symmetric_quantization_config(is_qat=True)), qat=True)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 16, generator=gen)  # the export's (static) batch size
    target = torch.randn(4, 4, generator=gen)
    losses = []
    for gm in (theirs, ours):
        opt = torch.optim.SGD(gm.parameters(), lr=0.1)
        run = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(gm(x), target)
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    grads = [p.grad for p in ours.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    assert losses[1][-1] < losses[1][0]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    _assert_same_observers(theirs, ours)
    conv_theirs, conv_ours = ao_pt2e.convert_pt2e(theirs), convert_pt2e(ours)
    _assert_same_qdq_counts(conv_theirs, conv_ours)
    a, b = conv_theirs(x), conv_ours(x)
    assert _sqnr(a, b) > 35


# --------------------------------------------------------------------------------------------
# sharing / derived specs with a hand-written quantizer (same on both sides)
# --------------------------------------------------------------------------------------------

def _bias_qparams(obs_or_fqs):
    act_scale, _ = obs_or_fqs[0].calculate_qparams()
    weight_scale, _ = obs_or_fqs[1].calculate_qparams()
    scale = (act_scale * weight_scale).to(torch.float32)
    return scale, torch.zeros_like(scale, dtype=torch.int64)


def _annotating_quantizer(base, spec_mod, obs_mod):
    """A quantizer (on ``base``) that quantizes linear with an int32 bias derived from the input
    and weight observers, and makes add share its first input's observer for both inputs."""
    act = spec_mod.QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127,
                                    qscheme=torch.per_tensor_affine,
                                    observer_or_fake_quant_ctr=obs_mod.MinMaxObserver)
    weight = spec_mod.QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127,
                                       qscheme=torch.per_tensor_symmetric,
                                       observer_or_fake_quant_ctr=obs_mod.MinMaxObserver)

    class Q(base):
        def annotate(self, gm):
            for n in gm.graph.nodes:
                if n.target is torch.ops.aten.linear.default:
                    x, w, b = n.args[:3]
                    bias = spec_mod.DerivedQuantizationSpec(
                        derived_from=[(x, n), (w, n)], derive_qparams_fn=_bias_qparams,
                        dtype=torch.int32, quant_min=-2**31, quant_max=2**31 - 1,
                        qscheme=torch.per_tensor_symmetric)
                    n.meta["quantization_annotation"] = spec_mod.QuantizationAnnotation(
                        input_qspec_map={x: act, w: weight, b: bias}, output_qspec=act,
                        _annotated=True)
                elif n.target is torch.ops.aten.add.Tensor:
                    a, b = n.args[:2]
                    shared = spec_mod.SharedQuantizationSpec((a, n))
                    n.meta["quantization_annotation"] = spec_mod.QuantizationAnnotation(
                        input_qspec_map={a: act, b: shared}, output_qspec=shared,
                        _annotated=True)
            return gm

        def validate(self, gm):
            pass

    return Q()


def test_shared_and_derived_specs_match_torchao():
    ao_quantizer_mod = pytest.importorskip("torchao.quantization.pt2e.quantizer")
    ao_obs = pytest.importorskip("torchao.quantization.pt2e.observer")
    from torchquant.quantization import quantizer as tq_quantizer_mod

    model, inputs, theirs, ours = _prepare_both(
        "linear_binary",
        _annotating_quantizer(ao_quantizer_mod.Quantizer, ao_quantizer_mod, ao_obs),
        _annotating_quantizer(Quantizer, tq_quantizer_mod, tq_obs))
    for batch in _calibration(inputs):
        theirs(*batch)
        ours(*batch)
    _assert_same_observers(theirs, ours)
    conv_theirs, conv_ours = ao_pt2e.convert_pt2e(theirs), convert_pt2e(ours)
    _assert_same_qdq_counts(conv_theirs, conv_ours)
    # the int32 bias is folded into an integer constant too
    assert any(getattr(conv_ours, n.target).dtype == torch.int32 for n in conv_ours.graph.nodes
               if n.op == "get_attr" and n.target.startswith("_frozen_param"))
    for batch in [inputs] + _calibration(inputs, 2):
        for a, b in zip(_outputs(conv_theirs, batch), _outputs(conv_ours, batch)):
            assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------
# bad input / silent no-op
# --------------------------------------------------------------------------------------------

def test_quantizer_annotating_nothing_warns():
    model, inputs = _float_model("mlp")
    with pytest.warns(UserWarning, match="annotated no node, so the model stays float"):
        gm = prepare_pt2e(_export(model, inputs), tq_xnn.XNNPACKQuantizer())
    gm(*inputs)
    out = convert_pt2e(gm)
    assert torch.equal(out(*inputs), model(*inputs))


def test_bad_inputs():
    model, inputs = _float_model("mlp")
    quantizer = tq_xnn.XNNPACKQuantizer().set_global(tq_xnn.get_symmetric_quantization_config())
    with pytest.raises(TypeError, match="exported model"):
        prepare_pt2e(model, quantizer)
    with pytest.raises(TypeError, match="export metadata"):
        prepare_pt2e(torch.fx.symbolic_trace(model), quantizer)
    with pytest.raises(TypeError, match="Quantizer"):
        prepare_pt2e(_export(model, inputs), object())
    with pytest.raises(ValueError, match="not prepared"):
        convert_pt2e(_export(model, inputs))
    with pytest.raises(ValueError, match="use_reference_representation"):
        convert_pt2e(_export(model, inputs), "yes")


# --------------------------------------------------------------------------------------------
# more configs, dynamic shapes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [{"is_dynamic": True}, {"reduce_range": True}],
                         ids=["dynamic", "reduce_range"])
def test_x86_inductor_dynamic_and_reduce_range(config):
    model, inputs, theirs, ours = _run_flow(
        "mlp", ao_x86.X86InductorQuantizer().set_global(
            ao_x86.get_default_x86_inductor_quantization_config(**config)),
        tq_x86.X86InductorQuantizer().set_global(
            tq_x86.get_default_x86_inductor_quantization_config(**config)))
    for batch in [inputs] + _calibration(inputs, 2):
        a, b = _outputs(theirs, batch)[0], _outputs(ours, batch)[0]
        assert torch.equal(a, b)


@pytest.mark.parametrize("is_dynamic", [False, True], ids=["static", "dynamic"])
def test_dynamic_batch_dim_survives_prepare_and_convert(is_dynamic):
    model, inputs = _float_model("mlp")
    batch = torch.export.Dim("batch")
    gm = torch.export.export(model, inputs, dynamic_shapes=({0: batch},)).module()
    gm = prepare_pt2e(gm, tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config(is_dynamic=is_dynamic)))
    gm(torch.randn(3, 16))
    gm(torch.randn(7, 16))
    converted = convert_pt2e(gm)
    assert converted(torch.randn(5, 16)).shape == (5, 4)
    again = torch.export.export(converted, (torch.randn(5, 16),), dynamic_shapes=({0: batch},))
    x = torch.randn(9, 16)
    assert torch.equal(again.module()(x), converted(x))


def test_convert_switches_graph_to_eval():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.fc(x))

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    gm = torch.export.export(M().train(), (x,)).module()
    assert any(n.target is torch.ops.aten.dropout.default and n.args[2]
               for n in gm.graph.nodes)
    gm = prepare_qat_pt2e(gm, tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config(is_qat=True)))
    gm(x)
    converted = convert_pt2e(gm)
    assert torch.equal(converted(x), converted(x))  # no dropout left active


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_qat_conv_bn_matches_torchao(per_channel):
    """conv + BN in QAT: the weight fake quant sees the BN-scaled weight during training and
    convert folds BN (running statistics) back into the conv -- step for step as torchao."""
    cls, make_inputs = MODELS["conv_bn_relu"]
    torch.manual_seed(0)
    model = cls().train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    inputs = make_inputs()
    theirs = ao_pt2e.prepare_qat_pt2e(
        _export(copy.deepcopy(model), inputs), ao_xnn.XNNPACKQuantizer().set_global(
            ao_xnn.get_symmetric_quantization_config(is_qat=True, is_per_channel=per_channel)))
    ours = prepare_qat_pt2e(
        _export(copy.deepcopy(model), inputs), tq_xnn.XNNPACKQuantizer().set_global(
            tq_xnn.get_symmetric_quantization_config(is_qat=True, is_per_channel=per_channel)))
    assert any(n.target is torch.ops.aten.batch_norm.default for n in ours.graph.nodes)
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(inputs[0].shape, generator=gen) for _ in range(3)]
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.05)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05)
    for x in batches:
        for gm, opt in ((theirs, opt_theirs), (ours, opt_ours)):
            opt.zero_grad()
            gm(x).square().mean().backward()
            opt.step()
        assert torch.equal(theirs(x), ours(x))
    _assert_same_observers(theirs, ours)
    conv_theirs, conv_ours = ao_pt2e.convert_pt2e(theirs), convert_pt2e(ours)
    _assert_same_qdq_counts(conv_theirs, conv_ours)
    assert not any(n.target is torch.ops.aten.batch_norm.default for n in conv_ours.graph.nodes)
    for x in batches:
        assert torch.equal(conv_theirs(x), conv_ours(x))


def test_qdq_nodes_take_provenance_meta():
    """q / dq nodes carry the module stack and custom meta (e.g. numeric debug handles) of the
    op whose value they quantize (of the consuming op for inputs and weights)."""
    model, inputs = _float_model("mlp")
    gm = _export(model, inputs)
    for i, n in enumerate(gm.graph.nodes):
        n.meta.setdefault("custom", {})["numeric_debug_handle"] = i
    gm = prepare_pt2e(gm, tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config()))
    gm(*inputs)
    converted = convert_pt2e(gm)
    for n in converted.graph.nodes:
        if n.op == "call_function" and "quantize_per" in str(n.target):
            assert "numeric_debug_handle" in n.meta.get("custom", {}), n
            assert "nn_module_stack" in n.meta, n
    relu = next(n for n in converted.graph.nodes if n.target is torch.ops.aten.relu.default)
    q_after_relu = next(iter(relu.users))
    assert q_after_relu.meta["custom"] == relu.meta["custom"]


def test_annotated_edge_that_cannot_be_observed_warns():
    """An input_qspec_map key that is not an argument of the node would be dropped silently by
    torchao; torchquant warns naming the node."""
    act = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127,
                           qscheme=torch.per_tensor_affine,
                           observer_or_fake_quant_ctr=tq_obs.MinMaxObserver)

    class Wrong(Quantizer):
        def annotate(self, gm):
            x = next(n for n in gm.graph.nodes if n.op == "placeholder")
            for n in gm.graph.nodes:
                if n.target is torch.ops.aten.relu.default:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={x: act}, output_qspec=act)
            return gm

        def validate(self, gm):
            pass

    model, inputs = _float_model("mlp")
    with pytest.warns(UserWarning, match=r"relu \(input x\)"):
        prepare_pt2e(_export(model, inputs), Wrong())
