"""Granularity vocabulary and the block-granular affine primitives / observers.

torch 2.13 keeps only the vocabulary (enums, granularities, ``get_block_size``), so that part is
checked against ``torch.ao.quantization.observer``.  torchao is not installed; the affine
primitives are checked against torch's per-tensor / per-channel observers where the two rules
coincide, and otherwise against a block-by-block loop written from torchao's formulas below.
"""
import dataclasses
import itertools

import pytest
import torch
import torch.fx
from torch.ao.quantization import observer as torch_obs

import torchquant as tq
from torchquant.quantization import affine_quantized as aq
from torchquant.quantization import granularity as g
from torchquant.quantization import observer as obs



@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (milliseconds on a loaded host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["MappingType", "ZeroPointDomain", "TorchAODType"])
def test_enums_match_torch(name):
    ours, theirs = getattr(g, name), getattr(torch_obs, name)
    assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]


def test_granularity_dataclasses():
    assert dataclasses.is_dataclass(g.Granularity)
    assert g.PerAxis(1) == g.PerAxis(1) and g.PerAxis(1) != g.PerAxis(0)
    assert hash(g.PerGroup(32)) == hash(g.PerGroup(32))
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.PerAxis(0).axis = 1
    assert g.PerBlock((1, 4)).block_size == (1, 4)
    # PerRow / PerToken are plain subclasses (no fields of their own), as in torch
    assert "__dataclass_fields__" not in vars(g.PerRow) and "__dataclass_fields__" not in vars(g.PerToken)
    assert g.PerRow() == g.PerRow() and g.PerToken() == g.PerToken()


def test_observer_module_reexports_vocabulary():
    for name in ["Granularity", "MappingType", "PerAxis", "PerBlock", "PerGroup", "PerRow",
                 "PerTensor", "PerToken", "TorchAODType", "ZeroPointDomain", "get_block_size",
                 "AffineQuantizedObserverBase"]:
        assert getattr(obs, name) is (getattr(g, name, None) or getattr(aq, name))
        assert name in obs.__all__


@pytest.mark.parametrize("shape", [(8, 16), (2, 3, 4), (5,), (2, 3, 4, 6)])
def test_get_block_size_matches_torch(shape):
    pairs = [(g.PerTensor(), torch_obs.PerTensor()), (g.PerRow(), torch_obs.PerRow()),
             (g.PerToken(), torch_obs.PerToken())]
    pairs += [(g.PerAxis(a), torch_obs.PerAxis(a)) for a in range(-len(shape), len(shape))]
    if len(shape) == 2:
        pairs.append((g.PerGroup(4), torch_obs.PerGroup(4)))
    for ours, theirs in pairs:
        assert g.get_block_size(shape, ours) == torch_obs.get_block_size(shape, theirs)


def test_get_block_size_per_block_and_errors():
    assert g.get_block_size((8, 16), g.PerBlock((2, 4))) == (2, 4)  # torchao; torch raises
    with pytest.raises(AssertionError, match="instance"):
        g.get_block_size((8, 16), g.PerTensor)
    with pytest.raises(AssertionError, match="2-D"):
        g.get_block_size((2, 8, 16), g.PerGroup(4))

    class Custom(g.Granularity):
        pass
    with pytest.raises(ValueError, match="unsupported granularity"):
        g.get_block_size((8, 16), Custom())


# --------------------------------------------------------------------------------------------
# Affine primitives
# --------------------------------------------------------------------------------------------

def _blocks(shape, block_size):
    """Index tuples of every block (a slow, obvious enumeration for the loop reference)."""
    ranges = [range(0, n, b) for n, b in zip(shape, block_size)]
    for corner in itertools.product(*ranges):
        yield tuple(slice(c, c + b) for c, b in zip(corner, block_size))


def _reference_qparams(x, mapping, block_size, qmin, qmax, eps):
    """torchao's choose_qparams_affine formulas applied block by block (preserve_zero, INT)."""
    scales, zps = [], []
    for idx in _blocks(x.shape, block_size):
        blk = x[idx]
        mn, mx = torch.clamp(blk.min(), max=0.0), torch.clamp(blk.max(), min=0.0)
        if mapping is g.MappingType.SYMMETRIC:
            scale = torch.maximum(-mn, mx) / (float(qmax - qmin) / 2)
            zp = torch.tensor(float(int((qmax + qmin + 1) / 2)))
        elif mapping is g.MappingType.SYMMETRIC_NO_CLIPPING_ERR:
            smin, smax = mn / float(qmin), mx / float(qmax)
            scale = torch.where(smin > smax, smin, smax)
            zp = torch.tensor(float(int((qmax + qmin + 1) / 2)))
        else:
            scale = torch.clamp((mx - mn) / float(qmax - qmin), min=eps)
            zp = torch.clamp(qmin - torch.round(mn / scale), qmin, qmax)
        scales.append(torch.clamp(scale, min=eps))
        zps.append(zp)
    return torch.stack(scales), torch.stack(zps)


def _reference_quantize(x, block_size, scale, zp, qmin, qmax):
    q = torch.empty_like(x)
    for k, idx in enumerate(_blocks(x.shape, block_size)):
        q[idx] = torch.clamp(torch.round(x[idx] * (1.0 / scale.flatten()[k])) + zp.flatten()[k],
                             qmin, qmax)
    return q


CASES = [  # (shape, block_size)
    ((8, 64), (1, 16)),      # per-group weight-only
    ((8, 64), (1, 64)),      # per row
    ((8, 64), (8, 64)),      # per tensor
    ((4, 6, 10), (1, 3, 5)),
    ((4, 6, 10), (4, 1, 10)),
]


MAPPINGS_AND_TARGETS = [(m, t) for m in g.MappingType
                        for t in (torch.int8, torch.uint8, torch.int4, torch.uint4)
                        # the no-clipping-error mapping divides by qmin: signed ranges only
                        if not (m is g.MappingType.SYMMETRIC_NO_CLIPPING_ERR and t in (torch.uint8, torch.uint4))]


@pytest.mark.parametrize("shape,block_size", CASES)
@pytest.mark.parametrize("mapping,target", MAPPINGS_AND_TARGETS)
def test_choose_and_quantize_match_block_loop_reference(shape, block_size, mapping, target):
    x = torch.randn(shape) * 3 + 0.5
    _, qmin, qmax = aq._resolve_bounds(target, None, None)
    eps = torch.finfo(torch.float32).eps
    scale, zp = aq.choose_qparams_affine(x, mapping, block_size, target)
    ref_scale, ref_zp = _reference_qparams(x, mapping, block_size, qmin, qmax, eps)
    assert torch.equal(scale.flatten(), ref_scale) and torch.equal(zp.flatten(), ref_zp)
    assert scale.dtype == torch.float32 and zp.dtype == torch.float32  # torchao: input dtype
    q = aq.quantize_affine(x, block_size, scale, zp, target)
    assert q.dtype == aq._resolve_bounds(target, None, None)[0] and q.shape == x.shape
    assert torch.equal(q.to(torch.float32), _reference_quantize(x, block_size, scale, zp, qmin, qmax))
    deq = aq.dequantize_affine(q, block_size, scale, zp, target)
    ref = torch.empty_like(x)
    for k, idx in enumerate(_blocks(x.shape, block_size)):
        ref[idx] = (q[idx].to(torch.int32) - zp.flatten()[k].to(torch.int32)).to(torch.float32) * scale.flatten()[k]
    assert torch.equal(deq, ref)


def test_scale_shape_drops_reduced_dims_like_torchao():
    x = torch.randn(8, 64)
    assert aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 16), torch.uint8)[0].shape == (8, 4)
    assert aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 64), torch.uint8)[0].shape == (8,)
    assert aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (8, 64), torch.uint8)[0].shape == ()
    # quantize accepts any qparam shape with one element per block
    s, z = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 16), torch.uint8)
    assert torch.equal(aq.quantize_affine(x, (1, 16), s, z, torch.uint8),
                       aq.quantize_affine(x, (1, 16), s.reshape(8, 4, 1), z.reshape(32), torch.uint8))


def test_per_tensor_and_per_axis_agree_with_torch_observers():
    """ASYMMETRIC/uint8 with preserve_zero is the observers' affine rule."""
    x = torch.randn(6, 40) * 2 + 1
    ref = torch_obs.MinMaxObserver()
    ref(x)
    scale, zp = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, x.shape, torch.uint8,
                                         zero_point_dtype=torch.int32)
    ref_scale, ref_zp = ref.calculate_qparams()
    assert torch.equal(scale.reshape(1), ref_scale) and torch.equal(zp.reshape(1), ref_zp)
    ref_pc = torch_obs.PerChannelMinMaxObserver(dtype=torch.qint8)
    ref_pc(x)
    scale, zp = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 40), torch.int8,
                                         zero_point_dtype=torch.int32)
    ref_scale, ref_zp = ref_pc.calculate_qparams()
    assert torch.equal(scale, ref_scale) and torch.equal(zp, ref_zp)


def test_per_tensor_quantize_matches_torch_fake_quantize():
    """The INT-domain formula is torch's fake-quantize one: round(x * (1/s)) + zp, clamped."""
    x = torch.randn(1000) * 4
    scale, zp = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, x.shape, torch.uint8)
    q = aq.quantize_affine(x, x.shape, scale, zp, torch.uint8)
    deq = aq.dequantize_affine(q, x.shape, scale, zp, torch.uint8)
    ref = torch.fake_quantize_per_tensor_affine(x, float(scale), int(zp), 0, 255)
    assert torch.equal(deq, ref)


def test_int4_per_group_weight_only_round_trip():
    w = torch.randn(32, 256)
    for mapping, target in [(g.MappingType.SYMMETRIC, torch.int4), (g.MappingType.ASYMMETRIC, torch.uint4),
                            (g.MappingType.SYMMETRIC_NO_CLIPPING_ERR, torch.int4)]:
        s, z = aq.choose_qparams_affine(w, mapping, (1, 32), target)
        q = aq.quantize_affine(w, (1, 32), s, z, target)
        lo, hi = aq._resolve_bounds(target, None, None)[1:]
        assert int(q.min()) >= lo and int(q.max()) <= hi
        deq = aq.dequantize_affine(q, (1, 32), s, z, target)
        err = (deq - w).abs().reshape(32, 8, 32).amax(-1)
        bound = s * (0.5 + 1e-5)
        if mapping is g.MappingType.SYMMETRIC:  # the +amax end may clip by up to one step
            bound = s * 1.5
        assert bool((err <= bound).all()), mapping


def test_float_zero_point_domain_round_trip():
    """tinygemm-style: preserve_zero=False, float zero point = min + scale * mid."""
    w = torch.randn(16, 128) + 0.3
    s, z = aq.choose_qparams_affine(w, g.MappingType.ASYMMETRIC, (1, 64), torch.uint4,
                                    preserve_zero=False, zero_point_domain=g.ZeroPointDomain.FLOAT)
    mn = w.reshape(16, 2, 64).amin(-1)
    assert torch.allclose(z, mn + s * 8)
    q = aq.quantize_affine(w, (1, 64), s, z, torch.uint4, zero_point_domain=g.ZeroPointDomain.FLOAT)
    deq = aq.dequantize_affine(q, (1, 64), s, z, torch.uint4, zero_point_domain=g.ZeroPointDomain.FLOAT)
    err = (deq - w).abs().reshape(16, 2, 64).amax(-1)
    assert bool((err <= s * 0.5001).all())


def test_none_zero_point_domain():
    w = torch.randn(4, 32)
    s, z = aq.choose_qparams_affine(w, g.MappingType.SYMMETRIC, (1, 32), torch.int8,
                                    zero_point_domain=g.ZeroPointDomain.NONE)
    assert z is None
    q = aq.quantize_affine(w, (1, 32), s, None, torch.int8, zero_point_domain=g.ZeroPointDomain.NONE)
    assert torch.equal(q.float(), torch.clamp(torch.round(w * (1.0 / s[:, None])), -128, 127))
    deq = aq.dequantize_affine(q, (1, 32), s, None, torch.int8, zero_point_domain=g.ZeroPointDomain.NONE)
    assert torch.equal(deq, q.float() * s[:, None])


def test_affine_dtypes_and_names():
    x = torch.randn(4, 8)
    # enum names (what the registered ops pass) work like the members
    a = aq.choose_qparams_affine(x, "ASYMMETRIC", (1, 8), torch.uint8, zero_point_domain="INT")
    b = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 8), torch.uint8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # torchquant dtypes and TorchAODType are accepted; sub-byte codes are stored unpacked
    for target, storage, lo, hi in [(tq.quint8, torch.uint8, 0, 255), (tq.quint4x2, torch.uint8, 0, 15),
                                    (g.TorchAODType.INT4, torch.int8, -8, 7), (torch.int3, torch.int8, -4, 3),
                                    (torch.uint2, torch.uint8, 0, 3), (torch.int16, torch.int16, -32768, 32767)]:
        assert aq._resolve_bounds(target, None, None) == (storage, lo, hi)
    # bf16 inputs: stats in float32, outputs cast to the requested / input dtype
    s, z = aq.choose_qparams_affine(x.bfloat16(), g.MappingType.ASYMMETRIC, (1, 8), torch.uint8)
    assert s.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    s, z = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 8), torch.uint8,
                                    scale_dtype=torch.float64, zero_point_dtype=torch.int64)
    assert s.dtype == torch.float64 and z.dtype == torch.int64
    out = aq.dequantize_affine(torch.zeros(4, 8, dtype=torch.uint8), (1, 8), s, z, torch.uint8,
                               output_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16


def test_affine_bad_input():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="divisible"):
        aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 3), torch.uint8)
    with pytest.raises(ValueError, match="one entry per dim"):
        aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (8,), torch.uint8)
    with pytest.raises(AssertionError, match="quant_max"):
        aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 8), torch.int8, -8, 300)
    with pytest.raises(ValueError, match="target dtype"):
        aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 8), torch.float16)
    with pytest.raises(ValueError, match="MappingType"):
        aq.choose_qparams_affine(x, "SIDEWAYS", (1, 8), torch.uint8)
    with pytest.raises(TypeError, match="floating"):
        aq.choose_qparams_affine(x.to(torch.int32), g.MappingType.ASYMMETRIC, (1, 8), torch.uint8)
    bad = x.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="choose_qparams_affine.*not finite"):
        aq.choose_qparams_affine(bad, g.MappingType.ASYMMETRIC, (1, 8), torch.uint8)
    s, z = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 8), torch.uint8)
    with pytest.raises(ValueError, match="elements"):
        aq.quantize_affine(x, (1, 4), s, z, torch.uint8)
    with pytest.raises(ValueError, match="integral"):
        aq.quantize_affine(x, (1, 8), s, z + 0.5, torch.uint8)
    with pytest.raises(ValueError, match="scale"):
        aq.quantize_affine(x, (1, 8), torch.zeros(4), z, torch.uint8)
    with pytest.raises(TypeError, match="stored as"):
        aq.dequantize_affine(torch.zeros(4, 8, dtype=torch.int8), (1, 8), s, z, torch.uint8)
    with pytest.raises(ValueError, match="symmetric"):
        aq.choose_qparams_affine(x, g.MappingType.SYMMETRIC, (1, 8), torch.int8,
                                 zero_point_domain=g.ZeroPointDomain.FLOAT)


def test_registered_ops_match_functions_and_pass_opcheck():
    x = torch.randn(4, 32)
    scale, zp = torch.ops.torchquant.choose_qparams_affine(
        x, "ASYMMETRIC", [1, 8], torch.uint8, None, None, None, None, None, True, "INT")
    ref_scale, ref_zp = aq.choose_qparams_affine(x, g.MappingType.ASYMMETRIC, (1, 8), torch.uint8)
    assert torch.equal(scale, ref_scale) and torch.equal(zp, ref_zp)
    q = torch.ops.torchquant.quantize_affine(x, [1, 8], scale, zp, torch.uint8, None, None, "INT")
    assert torch.equal(q, aq.quantize_affine(x, (1, 8), scale, zp, torch.uint8))
    deq = torch.ops.torchquant.dequantize_affine(q, [1, 8], scale, zp, torch.uint8, None, None, "INT",
                                                 output_dtype=torch.float32)
    assert torch.equal(deq, aq.dequantize_affine(q, (1, 8), scale, zp, torch.uint8))
    torch.library.opcheck(torch.ops.torchquant.quantize_affine.default,
                          (x, [1, 8], scale, zp, torch.uint8, None, None, "INT"))
    torch.library.opcheck(torch.ops.torchquant.dequantize_affine.default,
                          (q, [1, 8], scale, zp, torch.uint8, None, None, "INT"),
                          {"output_dtype": torch.float32})
    torch.library.opcheck(torch.ops.torchquant.choose_qparams_affine.default,
                          (x, "SYMMETRIC", [1, 8], torch.int8, None, None, None, None, None, True, "NONE"))


# --------------------------------------------------------------------------------------------
# Affine observers
# --------------------------------------------------------------------------------------------

def test_minmax_observer_accumulates_per_block():
    o = aq.AffineQuantizedMinMaxObserver(g.MappingType.ASYMMETRIC, torch.uint8, g.PerGroup(16))
    batches = [torch.randn(8, 64) * (k + 1) for k in range(3)]
    for b in batches:
        assert o(b) is b
    assert o.block_size == (1, 16) and o.original_dtype == torch.float32
    stacked = torch.stack(batches)
    ref = aq.choose_qparams_affine(stacked, g.MappingType.ASYMMETRIC, (3, 1, 16), torch.uint8)
    scale, zp = o.calculate_qparams()
    assert scale.shape == (8, 4)
    assert torch.equal(scale, ref[0]) and torch.equal(zp, ref[1])


def test_affine_observer_errors_and_defaults():
    with pytest.raises(AssertionError, match="granularity"):
        aq.AffineQuantizedMinMaxObserver(g.MappingType.ASYMMETRIC, torch.uint8, None)
    o = aq.AffineQuantizedMinMaxObserver(g.MappingType.SYMMETRIC, torch.int8, g.PerAxis(0))
    with pytest.warns(UserWarning, match="before observing"):
        assert [t.tolist() for t in o.calculate_qparams()] == [[1.0], [0]]
    o(torch.randn(4, 8))
    with pytest.raises(ValueError, match="block grid"):
        o(torch.randn(5, 8))
    with pytest.raises(ValueError, match="AffineQuantizedMinMaxObserver.*max_val.*not finite"):
        o(torch.tensor([[1.0, float("inf")]] * 4))
    factory = aq.AffineQuantizedMinMaxObserver.with_args(
        mapping_type=g.MappingType.ASYMMETRIC, target_dtype=torch.uint8, granularity=g.PerTensor())
    assert isinstance(factory(), aq.AffineQuantizedMinMaxObserver) and factory() is not factory()


def test_affine_observer_state_dict_round_trip():
    src = aq.AffineQuantizedMinMaxObserver(g.MappingType.ASYMMETRIC, torch.uint8, g.PerGroup(8))
    src(torch.randn(4, 32))
    dst = aq.AffineQuantizedMinMaxObserver(g.MappingType.ASYMMETRIC, torch.uint8, g.PerGroup(8))
    dst.load_state_dict(src.state_dict())
    dst.original_dtype = src.original_dtype
    assert [torch.equal(a, b) for a, b in zip(dst.calculate_qparams(), src.calculate_qparams())] == [True, True]


class _Net(torch.nn.Module):
    def __init__(self, observer):
        super().__init__()
        self.linear = torch.nn.Linear(32, 16)
        self.obs = observer

    def forward(self, x):
        return torch.relu(self.obs(self.linear(x)))


class _ObserversAreLeaves(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, (obs.ObserverBase, aq.AffineQuantizedObserverBase)) or super().is_leaf_module(m, qualname)


def _trace(model):
    return torch.fx.GraphModule(model, _ObserversAreLeaves().trace(model))


@pytest.mark.parametrize("dynamic", [False, True])
def test_convert_replaces_observer_by_affine_ops(dynamic):
    observer = aq.AffineQuantizedMinMaxObserver(g.MappingType.ASYMMETRIC, torch.uint8, g.PerToken())
    observer.is_dynamic = dynamic
    gm = _trace(_Net(observer))
    x = torch.randn(6, 32)
    gm(x)
    node = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "obs")
    observer.convert(gm, node)
    gm.recompile()
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.torchquant.quantize_affine in targets
    assert (torch.ops.torchquant.choose_qparams_affine in targets) is dynamic
    y = gm.linear(x).detach()
    if dynamic:
        scale, zp = aq.choose_qparams_affine(y, g.MappingType.ASYMMETRIC, (1, 16), torch.uint8)
    else:
        scale, zp = observer.calculate_qparams()
    ref = aq.dequantize_affine(aq.quantize_affine(y, (1, 16), scale, zp, torch.uint8), (1, 16),
                               scale, zp, torch.uint8)
    assert torch.equal(gm(x), torch.relu(ref))


def test_convert_needs_observed_data():
    observer = aq.AffineQuantizedMinMaxObserver(g.MappingType.ASYMMETRIC, torch.uint8, g.PerTensor())
    gm = _trace(_Net(observer))
    node = next(n for n in gm.graph.nodes if n.target == "obs")
    with pytest.raises(AssertionError, match="block_size"):
        observer.convert(gm, node)
