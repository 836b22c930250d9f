"""Fake-quantize modules against torch.ao.quantization (the oracle), bit for bit."""
import io

import pytest
import torch
import torch.ao.quantization as tq
from torch import nn

import torchquant
from torchquant import affine
from torchquant.quantization import fake_quantize as fq
from torchquant.quantization import observer as obs

pytestmark = pytest.mark.filterwarnings("ignore:.*reduce_range.*:UserWarning")

# Every default factory of SPEC §4.2 that both libraries define under the same name.
DEFAULT_FAKE_QUANTS = [
    "default_fake_quant", "default_weight_fake_quant", "default_dynamic_fake_quant",
    "default_fixed_qparams_range_neg1to1_fake_quant", "default_fixed_qparams_range_0to1_fake_quant",
    "default_per_channel_weight_fake_quant", "default_embedding_fake_quant",
    "default_embedding_fake_quant_4bit", "default_histogram_fake_quant",
    "default_fused_act_fake_quant", "default_fused_wt_fake_quant",
    "default_fused_per_channel_wt_fake_quant", "fused_wt_fake_quant_range_neg_127_to_127",
    "fused_per_channel_wt_fake_quant_range_neg_127_to_127",
]


def assert_same_state(ours: nn.Module, theirs: nn.Module) -> None:
    """Same state-dict keys in the same order, same values and dtypes."""
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), (key, a[key], b[key])


def batches(n: int, shape=(4, 3, 5, 5)):
    """Batches whose range drifts, so moving averages and qparams keep changing."""
    gen = torch.Generator().manual_seed(1)
    for step in range(n):
        yield torch.randn(shape, generator=gen) * (1 + step) + 0.3 * step


def run_both(ours: nn.Module, theirs: nn.Module, x: torch.Tensor) -> None:
    """One forward/backward through each module; outputs, input gradients and buffers equal."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    grad = torch.randn_like(x)
    ya.backward(grad)
    yb.backward(grad)
    assert torch.equal(ya, yb)
    assert torch.equal(xa.grad, xb.grad)
    assert_same_state(ours, theirs)


@pytest.mark.parametrize("name", DEFAULT_FAKE_QUANTS)
def test_default_fake_quants_match_torch_over_batches(name):
    ours, theirs = getattr(fq, name)(), getattr(tq, name)()
    shape = (16, 4) if "embedding" in name else (4, 3, 5, 5)
    for step, x in enumerate(batches(6, shape)):
        if step == 4:  # frozen qparams from here on
            ours.apply(fq.disable_observer)
            theirs.apply(tq.disable_observer)
        run_both(ours, theirs, x)


@pytest.mark.parametrize("qscheme", [torch.per_tensor_affine, torch.per_tensor_symmetric,
                                     torch.per_channel_affine, torch.per_channel_symmetric])
@pytest.mark.parametrize("dtype,qrange", [(torch.quint8, (0, 255)), (torch.qint8, (-128, 127)),
                                          (torch.quint8, (0, 127))])
def test_fused_matches_torch(qscheme, dtype, qrange):
    per_channel = qscheme in (torch.per_channel_affine, torch.per_channel_symmetric)
    ours_obs = (obs.MovingAveragePerChannelMinMaxObserver if per_channel
                else obs.MovingAverageMinMaxObserver)
    torch_obs = (tq.MovingAveragePerChannelMinMaxObserver if per_channel
                 else tq.MovingAverageMinMaxObserver)
    kwargs = dict(quant_min=qrange[0], quant_max=qrange[1], qscheme=qscheme,
                  averaging_constant=0.3)
    ours = fq.FusedMovingAvgObsFakeQuantize(ours_obs, dtype=dtype, **kwargs)
    theirs = tq.FusedMovingAvgObsFakeQuantize(torch_obs, dtype=dtype, **kwargs)
    for step, x in enumerate(batches(7, (6, 4, 3))):
        if step == 2:  # observe without fake-quantizing: qparams are not recomputed
            ours.disable_fake_quant()
            theirs.disable_fake_quant()
        if step == 3:
            ours.enable_fake_quant()
            theirs.enable_fake_quant()
        if step == 5:
            ours.disable_observer()
            theirs.disable_observer()
        run_both(ours, theirs, x)


def test_fused_all_negative_and_positive_channels():
    # SPEC §4.3: a "symmetric" channel that does not straddle 0 falls back to asymmetric.
    x = torch.stack([torch.linspace(-3.0, -1.0, 8), torch.linspace(0.5, 2.0, 8),
                     torch.linspace(-11.2315, 5.0, 8)])
    ours = fq.default_fused_per_channel_wt_fake_quant()
    theirs = tq.default_fused_per_channel_wt_fake_quant()
    run_both(ours, theirs, x)
    assert ours.zero_point.tolist() == [127, -128, 0]
    assert ours.scale[2].item() == pytest.approx(11.2315 / 128)


def test_fused_choose_qparams_on_rounding_ties():
    """The fbgemm routine's zero-point rule differs from ATen's quant_utils one exactly on ties:
    ranges built so that ``min / scale`` sits on a half integer."""
    gen = torch.Generator().manual_seed(3)
    on = torch.tensor([1], dtype=torch.long)
    for i in range(300):
        step = torch.rand((), generator=gen).item() * 0.1 + 1e-3
        k = int(torch.randint(1, 250, (), generator=gen))
        lo, hi = -(k + 0.5) * step, (254.5 - k) * step
        if i % 3 == 0:  # around the 6.1e-5 scale floor instead
            lo, hi = lo * 6.1e-5 / step, hi * 6.1e-5 / step
        for qmin, qmax, symmetric in [(0, 255, False), (-128, 127, False), (-128, 127, True),
                                      (0, 127, False), (-127, 127, True)]:
            x = torch.tensor([lo, hi])
            running = [torch.tensor(float("inf")), torch.tensor(float("-inf"))]
            scale, zp = torch.tensor([1.0]), torch.tensor([0], dtype=torch.int32)
            torch.fused_moving_avg_obs_fake_quant(x, on, on, *running, scale, zp, 0.01, qmin,
                                                  qmax, 0, False, symmetric)
            ours = affine.choose_qparams_aten(x.min(), x.max(), qmin, qmax,
                                              preserve_sparsity=symmetric, fbgemm=True)
            assert ours[0].item() == scale.item() and ours[1].item() == zp.item()


def test_choose_qparams_aten_default_still_matches_dynamic_quantization():
    # The default (quant_utils) variant must stay what quantize_per_tensor_dynamic uses.
    gen = torch.Generator().manual_seed(4)
    for _ in range(200):
        step = torch.rand((), generator=gen).item() * 0.1 + 1e-3
        k = int(torch.randint(1, 250, (), generator=gen))
        x = torch.tensor([-(k + 0.5) * step, (254.5 - k) * step])
        for qdtype, qmin, qmax in [(torch.quint8, 0, 255), (torch.qint8, -128, 127)]:
            q = torch.quantize_per_tensor_dynamic(x, qdtype, False)
            scale, zp = affine.choose_qparams_aten(x.min(), x.max(), qmin, qmax)
            assert zp.item() == q.q_zero_point()
            assert scale.item() == torch.tensor(q.q_scale(), dtype=torch.float32).item()


def test_fused_edge_ranges():
    for values in ([0.0, 1e-6], [2.0, 2.0], [0.0, 0.0], [-1e-7, 1e-7]):
        for name in ("default_fused_act_fake_quant", "default_fused_wt_fake_quant"):
            run_both(getattr(fq, name)(), getattr(tq, name)(), torch.tensor(values))
    m = fq.default_fused_act_fake_quant()
    m(torch.tensor([0.0, 1e-6]))
    assert m.scale.item() == pytest.approx(6.1e-5)  # ATen's floor, not eps


def test_fused_fake_quant_before_any_observation_matches_torch():
    ours, theirs = fq.default_fused_act_fake_quant(), tq.default_fused_act_fake_quant()
    ours.disable_observer()
    theirs.disable_observer()
    run_both(ours, theirs, torch.randn(10))  # (+inf, -inf) running range -> scale 0.1


def test_fused_empty_input_is_a_no_op():
    m = fq.default_fused_act_fake_quant()
    out = m(torch.empty(0, 3))
    assert out.shape == (0, 3)
    assert m.activation_post_process.min_val.item() == float("inf")


def test_fused_any_channel_axis():
    # [TQ] torch only supports ch_axis=0; here axis 1 equals axis 0 on the transposed input.
    x = torch.randn(5, 6, 3)
    on_axis1 = fq.FusedMovingAvgObsFakeQuantize(
        obs.MovingAveragePerChannelMinMaxObserver, -128, 127, dtype=torchquant.qint8,
        qscheme=torchquant.per_channel_symmetric, ch_axis=1)
    on_axis0 = fq.default_fused_per_channel_wt_fake_quant()
    y1 = on_axis1(x)
    y0 = on_axis0(x.transpose(0, 1).contiguous())
    assert torch.equal(y1, y0.transpose(0, 1))
    assert torch.equal(on_axis1.scale, on_axis0.scale)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fused_rejects_non_finite_input(bad):
    x = torch.randn(10)
    x[3] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        fq.default_fused_act_fake_quant()(x)


def test_spec_oracle_example():
    m = fq.FakeQuantize()
    out = m(torch.tensor([-1.0, 0.5, 2.0, 3.0]))
    assert m.scale.item() == pytest.approx(0.0156863, abs=1e-7)
    assert m.zero_point.item() == 64 and m.zero_point.dtype == torch.int32
    torch.testing.assert_close(out, torch.tensor([-1.0039216, 0.5019608, 1.9921570, 2.9960785]))


def test_spec_elementwise_example():
    m = fq.FakeQuantize(quant_min=0, quant_max=255)
    m.disable_observer()
    m.scale.fill_(0.01)
    m.zero_point.fill_(100)
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 1.55, 1.56, 2.0], requires_grad=True)
    out = m(x)
    out.sum().backward()
    torch.testing.assert_close(out, torch.tensor([-1.0, -1.0, 0.0, 1.0, 1.55, 1.55, 1.55]))
    assert x.grad.tolist() == [0, 1, 1, 1, 1, 0, 0]


def test_fused_symmetric_scale_differs_from_observer_rule():
    x = torch.tensor([-11.2315, 3.0])
    fused, plain = fq.default_fused_wt_fake_quant(), fq.default_weight_fake_quant()
    fused(x)
    plain(x)
    assert fused.scale.item() == pytest.approx(11.2315 / 128)
    assert plain.scale.item() == pytest.approx(11.2315 / 127.5)


def test_observation_follows_flags_not_training_mode():
    m = fq.default_fake_quant().eval()
    m(torch.tensor([0.0, 4.0]))
    assert m.scale.item() != 1.0
    frozen = m.scale.clone()
    m.train().apply(fq.disable_observer)
    m(torch.tensor([0.0, 40.0]))
    assert torch.equal(m.scale, frozen)


def test_apply_helpers_on_a_model():
    model = nn.Sequential(nn.Linear(3, 3), fq.default_fake_quant(), nn.ReLU(),
                          fq.default_fused_act_fake_quant())
    fake_quants = [model[1], model[3]]
    model.apply(fq.disable_fake_quant)
    model.apply(fq.disable_observer)
    assert all(m.fake_quant_enabled.item() == 0 and m.observer_enabled.item() == 0
               for m in fake_quants)
    x = torch.randn(2, 3)
    assert torch.equal(model(x), model[2](model[0](x)))  # both halves off: identity
    model.apply(fq.enable_fake_quant)
    model.apply(fq.enable_observer)
    assert all(m.fake_quant_enabled.item() == 1 and m.observer_enabled.item() == 1
               for m in fake_quants)
    assert model[3].fake_quant_enabled.dtype == torch.long
    assert model[1].fake_quant_enabled.dtype == torch.uint8


def test_fixed_qparams_fake_quant_shares_observer_buffers():
    m = fq.default_fixed_qparams_range_neg1to1_fake_quant()
    assert m.scale is m.activation_post_process.scale
    assert m.calculate_qparams() == (m.scale, m.zero_point)
    assert m.scale.item() == 2.0 / 256 and m.zero_point.item() == 128
    with pytest.raises(AssertionError, match="FixedQParamsObserver"):
        fq.FixedQParamsFakeQuantize(obs.MinMaxObserver)


@pytest.mark.parametrize("name", DEFAULT_FAKE_QUANTS)
def test_state_dicts_load_both_ways(name):
    shape = (16, 4) if "embedding" in name else (4, 3, 5, 5)
    x = next(batches(1, shape))
    trained_torch, trained_ours = getattr(tq, name)(), getattr(fq, name)()
    trained_torch(x)
    trained_ours(x)
    buffer = io.BytesIO()
    torch.save(trained_torch.state_dict(), buffer)
    buffer.seek(0)
    fresh = getattr(fq, name)()
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert_same_state(fresh, trained_torch)
    fresh_torch = getattr(tq, name)()
    fresh_torch.load_state_dict(trained_ours.state_dict())
    assert_same_state(trained_ours, fresh_torch)


def test_construction_errors():
    with pytest.raises(AssertionError, match="quant_min out of bound"):
        fq.FakeQuantize(quant_min=-1, quant_max=255)
    with pytest.raises(AssertionError, match="quant_max out of bound"):
        fq.FakeQuantize(quant_min=-128, quant_max=128, dtype=torchquant.qint8)
    with pytest.raises(AssertionError, match="quant_max out of bound"):  # dtype from the factory
        fq.FakeQuantize(obs.MovingAverageMinMaxObserver.with_args(dtype=torch.qint8),
                        quant_min=0, quant_max=255)
    with pytest.raises(AssertionError, match="less than or equal"):
        fq.FakeQuantize(quant_min=10, quant_max=5)
    with pytest.raises(AssertionError, match="MovingAverageMinMaxObserver"):
        fq.FusedMovingAvgObsFakeQuantize(obs.MinMaxObserver)

    class UnknownSchemeObserver(nn.Module):
        quant_min, quant_max, is_dynamic, dtype, qscheme = 0, 255, False, torchquant.quint8, "?"

        def __init__(self, **kwargs):
            super().__init__()

    with pytest.raises(AssertionError, match="per channel and per tensor"):
        fq.FakeQuantize(UnknownSchemeObserver)


def test_dtype_aliases_are_interchangeable():
    for dtype in (torch.qint8, torch.int8, torchquant.qint8):
        m = fq.FakeQuantize(quant_min=-128, quant_max=127, dtype=dtype,
                            qscheme=torch.per_tensor_symmetric)
        assert m.dtype == torchquant.qint8 and (m.quant_min, m.quant_max) == (-128, 127)


def test_extra_repr_and_calculate_qparams():
    m = fq.default_per_channel_weight_fake_quant()
    m(torch.randn(3, 4))
    assert "ch_axis=0" in repr(m) and "quant_min=-128" in repr(m)
    scale, zp = m.calculate_qparams()
    assert torch.equal(scale, m.scale) and torch.equal(zp.to(torch.int32), m.zero_point)
    assert "reduce_range=" in repr(fq.default_fused_act_fake_quant())


def test_with_args_keywords_match_torch():
    for name in DEFAULT_FAKE_QUANTS:
        ours, theirs = getattr(fq, name), getattr(tq, name)
        assert ours.p.func.__name__ == theirs.p.func.__name__
        assert set(ours.p.keywords) == set(theirs.p.keywords), name
        for key, value in ours.p.keywords.items():
            if key != "observer":
                assert value == theirs.p.keywords[key], (name, key)


@pytest.mark.parametrize("per_channel", [False, True])
def test_learnable_fake_quantize_matches_torch(per_channel):
    from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize as Theirs

    if per_channel:
        kwargs = dict(quant_min=0, quant_max=255, channel_len=3, use_grad_scaling=True,
                      ch_axis=1, qscheme=torch.per_channel_affine)
        ours = fq._LearnableFakeQuantize(obs.MovingAveragePerChannelMinMaxObserver, **kwargs)
        theirs = Theirs(tq.MovingAveragePerChannelMinMaxObserver, **kwargs)
    else:
        ours = fq._LearnableFakeQuantize(obs.MovingAverageMinMaxObserver, quant_min=0,
                                         quant_max=15)
        theirs = Theirs(tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=15)
    for step, x in enumerate(batches(5, (4, 3, 6))):
        if step == 2:
            ours.enable_param_learning()
            theirs.enable_param_learning()
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), theirs(xb)
        grad = torch.randn_like(x)
        ya.backward(grad)
        yb.backward(grad)
        assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
        for a, b in ((ours.scale, theirs.scale), (ours.zero_point, theirs.zero_point)):
            assert torch.equal(a.detach(), b.detach())
            if step >= 2:
                assert torch.equal(a.grad, b.grad)
                with torch.no_grad():  # one SGD step so the next batch sees new qparams
                    a -= 1e-4 * a.grad
                    b -= 1e-4 * b.grad
                a.grad = b.grad = None
    assert ours.calculate_qparams()[1].dtype == torch.long
    assert ours.bitwidth == theirs.bitwidth


def test_learnable_fake_quantize_errors():
    with pytest.raises(AssertionError, match="strictly less"):
        fq._LearnableFakeQuantize(obs.MovingAverageMinMaxObserver, quant_min=5, quant_max=5)
    with pytest.raises(AssertionError, match="Channel size"):
        fq._LearnableFakeQuantize(obs.MovingAverageMinMaxObserver, channel_len=0)
