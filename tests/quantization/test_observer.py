"""Observers against torch.ao.quantization.observer (torch 2.13) as the oracle.

qparams and buffers must be bit-identical (``torch.equal`` plus dtype and shape); the cases
where torchquant deliberately differs (NaN/Inf, bad ch_axis, channel-count changes) are tested
separately below.
"""
import copy
import io
import itertools
import warnings

import pytest
import torch
import torch.fx
from torch.ao.quantization import observer as T

import torchquant as tq
from torchquant.quantization import observer as O

# (dtype as passed to both, a custom range inside it)
DTYPES = [
    (torch.quint8, (0, 127)), (torch.qint8, (-127, 127)), (torch.qint32, (-1000, 1000)),
    (torch.quint4x2, (0, 7)), (torch.uint8, (0, 200)), (torch.int8, (-100, 27)),
    (torch.int32, (-(2**20), 2**20)), (torch.int16, (-300, 300)), (torch.uint16, (0, 5000)),
]
PER_TENSOR = [torch.per_tensor_affine, torch.per_tensor_symmetric]
PER_CHANNEL = [torch.per_channel_affine, torch.per_channel_symmetric,
               torch.per_channel_affine_float_qparams]


def _symmetric_uint8_reduce_range(kwargs):
    """torch rejects symmetric + reduce_range for torch.quint8 but not for its alias torch.uint8,
    and then returns zero_point 128 outside the 0..127 range.  torchquant treats the alias like
    quint8 and rejects both (tested in test_construction_errors_keep_torch_exception_types)."""
    return (kwargs.get("dtype") is torch.uint8 and kwargs.get("reduce_range")
            and kwargs.get("qscheme") in (torch.per_tensor_symmetric, torch.per_channel_symmetric))


def _build(cls_pair, **kwargs):
    """Both implementations with the same arguments, or the exception type both raise."""
    ours_cls, torch_cls = cls_pair
    if _symmetric_uint8_reduce_range(kwargs):
        return None
    errors = []
    built = []
    for cls in (torch_cls, ours_cls):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built.append(cls(**kwargs))
        except Exception as exc:  # noqa: BLE001 - comparing exception types with torch
            errors.append(type(exc))
    if errors:
        assert len(errors) == 2 and errors[0] is errors[1], (kwargs, errors)
        return None
    return built[1], built[0]


def _assert_same_qparams(ours, theirs, context):
    (s, z), (ts, tz) = ours.calculate_qparams(), theirs.calculate_qparams()
    assert s.dtype == ts.dtype and z.dtype == tz.dtype and s.shape == ts.shape, context
    assert torch.equal(s, ts) and torch.equal(z, tz), (context, s, ts, z, tz)


def _assert_same_config(ours, theirs, context):
    for name in ("quant_min", "quant_max", "has_customized_qrange", "reduce_range", "is_dynamic"):
        assert getattr(ours, name) == getattr(theirs, name), (context, name)
    assert ours.qscheme == theirs.qscheme and ours.dtype == theirs.dtype, context


def _assert_same_buffers(ours, theirs, context):
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b), context
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (context, key)


def _batches(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) * scale + shift
            for scale, shift in [(1.0, 0.0), (3.0, 0.5), (0.5, -2.0), (2.0, 1.0)]]


def _settings(qschemes):
    for (dtype, custom), qscheme, reduce_range, custom_range in itertools.product(
            DTYPES, qschemes, [False, True], [False, True]):
        kwargs = dict(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range)
        if custom_range:
            kwargs.update(quant_min=custom[0], quant_max=custom[1])
        yield kwargs



@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (milliseconds on a loaded host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

# --------------------------------------------------------------------------------------------
# Bit-exact qparams for the min/max family
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pair,extra", [
    ((O.MinMaxObserver, T.MinMaxObserver), {}),
    ((O.MovingAverageMinMaxObserver, T.MovingAverageMinMaxObserver), {}),
    ((O.MovingAverageMinMaxObserver, T.MovingAverageMinMaxObserver), {"averaging_constant": 0.3}),
])
def test_per_tensor_minmax_family_matches_torch(pair, extra):
    compared = 0
    for k, kwargs in enumerate(_settings(PER_TENSOR)):
        built = _build(pair, **kwargs, **extra)
        if built is None:
            continue
        ours, theirs = built
        _assert_same_config(ours, theirs, kwargs)
        for x in _batches((3, 17), seed=k):
            assert ours(x) is x
            theirs(x)
            _assert_same_buffers(ours, theirs, kwargs)
            _assert_same_qparams(ours, theirs, kwargs)
        compared += 1
    assert compared >= 60  # of 72 settings; the rest raise in both


@pytest.mark.parametrize("pair,extra", [
    ((O.PerChannelMinMaxObserver, T.PerChannelMinMaxObserver), {}),
    ((O.MovingAveragePerChannelMinMaxObserver, T.MovingAveragePerChannelMinMaxObserver),
     {"averaging_constant": 0.25}),
])
def test_per_channel_minmax_family_matches_torch(pair, extra):
    compared = 0
    for k, kwargs in enumerate(_settings(PER_CHANNEL)):
        ch_axis = [0, 1, -1, 2][k % 4]
        built = _build(pair, ch_axis=ch_axis, **kwargs, **extra)
        if built is None:
            continue
        ours, theirs = built
        _assert_same_config(ours, theirs, kwargs)
        for x in _batches((4, 5, 6), seed=k):
            ours(x)
            theirs(x)
            _assert_same_buffers(ours, theirs, kwargs)
            _assert_same_qparams(ours, theirs, kwargs)
        compared += 1
    assert compared >= 90  # of 108 settings; the rest raise in both


def test_affine_range_helpers_match_torch_utils():
    """affine.calculate_qmin_qmax / validate_qmin_qmax, the observers' range rules, vs torch.ao."""
    from torch.ao.quantization import utils as torch_utils
    from torchquant import affine
    ranges = [(None, None), (0, 255), (0, 127), (-128, 127), (-127, 127), (-64, 63), (0, 15),
              (-(2**31), 2**31 - 1), (0, 2**32 - 1), (-300, 300), (-200, 100), (0, 2**16 - 1)]
    dtypes = [torch.quint8, torch.qint8, torch.qint32, torch.quint4x2, torch.uint8, torch.int8,
              torch.int32, torch.int16, torch.uint16, torch.float8_e4m3fn]
    for (qmin, qmax), dtype, reduce_range in itertools.product(ranges, dtypes, [False, True]):
        custom = qmin is not None
        outcome = []
        for fn in (torch_utils.calculate_qmin_qmax, affine.calculate_qmin_qmax):
            try:
                outcome.append(fn(qmin, qmax, custom, dtype, reduce_range))
            except AssertionError:
                outcome.append(AssertionError)
        assert outcome[0] == outcome[1], (qmin, qmax, dtype, reduce_range)
    for qmin, qmax in [(0, 10), (-5, 0), (1, 10), (-10, -1), (0, 0), (3, 3)]:
        outcome = []
        for fn in (torch_utils.validate_qmin_qmax, affine.validate_qmin_qmax):
            try:
                outcome.append(fn(qmin, qmax))
            except AssertionError:
                outcome.append(AssertionError)
        assert outcome[0] == outcome[1], (qmin, qmax)


def test_spec_worked_examples():
    x = torch.tensor([-1.0, 0.5, 2.0, 3.0])
    cases = [
        ({}, 0.01568627543747425, 64, torch.int32),
        ({"dtype": tq.qint8}, 0.01568627543747425, -64, torch.int32),
        ({"dtype": tq.qint8, "qscheme": tq.per_tensor_symmetric}, 0.0235294122248888, 0, torch.int64),
        ({"qscheme": tq.per_tensor_symmetric}, 0.0235294122248888, 128, torch.int64),
        ({"reduce_range": True}, 0.031496062874794006, 32, torch.int32),
        ({"dtype": tq.qint8, "qscheme": tq.per_tensor_symmetric, "quant_min": -127, "quant_max": 127},
         0.023622047156095505, 0, torch.int64),
        ({"qscheme": tq.per_tensor_symmetric, "quant_min": 0, "quant_max": 127}, 0.04724409431219101, 63,
         torch.int64),
        ({"dtype": tq.quint4x2}, 0.2666666805744171, 4, torch.int32),
    ]
    for kwargs, scale, zp, zp_dtype in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            o = O.MinMaxObserver(**kwargs)
        o(x)
        s, z = o.calculate_qparams()
        assert s.tolist() == [pytest.approx(scale, rel=0, abs=0)] and z.tolist() == [zp], kwargs
        assert z.dtype == zp_dtype and s.shape == (1,)
    m = O.MovingAverageMinMaxObserver()
    m(torch.tensor([0.0, 1.0]))
    m(torch.tensor([-1.0, 3.0]))
    assert m.min_val.item() == pytest.approx(-0.01) and m.max_val.item() == pytest.approx(1.02)


def test_edge_data():
    o = O.MinMaxObserver()
    o(torch.zeros(10))
    s, z = o.calculate_qparams()
    assert s.item() == torch.finfo(torch.float32).eps and z.item() == 0  # positive, finite
    o = O.MinMaxObserver()
    o(torch.tensor([-5.0, -1.0]))
    assert o.calculate_qparams()[1].item() == 255
    pc = O.PerChannelMinMaxObserver(qscheme=tq.per_channel_affine_float_qparams)
    pc(torch.tensor([[2.0, 2.0], [-1.0, 2.0]]))
    s, z = pc.calculate_qparams()
    assert s.tolist()[0] == 1.0 and z.dtype == torch.float32  # constant row: scale 1.0
    empty = O.MinMaxObserver()
    empty(torch.empty(0))
    assert empty.min_val.item() == float("inf")


def test_inputs_of_other_dtypes_match_torch():
    for x in [torch.randn(50, dtype=torch.float64) * 1e3, torch.randn(50).half(),
              torch.randint(-50, 50, (50,), dtype=torch.int32).float().bfloat16()]:
        ours, theirs = O.MinMaxObserver(), T.MinMaxObserver()
        ours(x)
        theirs(x)
        _assert_same_buffers(ours, theirs, x.dtype)
        ours, theirs = O.PerChannelMinMaxObserver(), T.PerChannelMinMaxObserver()
        ours(x.view(5, 10))
        theirs(x.view(5, 10))
        _assert_same_buffers(ours, theirs, x.dtype)


def test_dtype_normalisation():
    assert O.MinMaxObserver(dtype=torch.uint8).dtype is tq.quint8
    assert O.MinMaxObserver(dtype=torch.quint8).dtype is tq.quint8
    assert O.MinMaxObserver(dtype=torch.int8).dtype is tq.qint8
    assert O.PerChannelMinMaxObserver(dtype=torch.int32).dtype is tq.qint32
    assert O.MinMaxObserver(dtype=torch.int16).dtype is torch.int16
    assert O.PlaceholderObserver(dtype=torch.float16).dtype is torch.float16
    assert O.PlaceholderObserver(dtype=torch.quint8).dtype is tq.quint8
    o = O.MinMaxObserver(dtype=tq.qint8, qscheme=torch.per_tensor_symmetric)
    assert o.qscheme is tq.per_tensor_symmetric and o.qscheme == torch.per_tensor_symmetric
    assert o.dtype == torch.qint8  # still compares equal to torch's dtype


# --------------------------------------------------------------------------------------------
# HistogramObserver
# --------------------------------------------------------------------------------------------

HIST_CONFIGS = [
    {}, {"dtype": torch.qint8, "qscheme": torch.per_tensor_symmetric}, {"quant_min": 0, "quant_max": 127},
    {"dtype": torch.quint4x2}, {"bins": 256}, {"bins": 1000, "dtype": torch.int16},
    {"dtype": torch.qint32}, {"reduce_range": True}, {"dtype": torch.uint8, "qscheme": torch.per_tensor_symmetric},
]
DATA = {
    "normal": lambda n, gen: torch.randn(n, generator=gen),
    "positive": lambda n, gen: torch.rand(n, generator=gen) * 3 + 1,
    "heavy": lambda n, gen: torch.randn(n, generator=gen) ** 3,
    "spiky": lambda n, gen: torch.randint(-3, 4, (n,), generator=gen).float(),
    "constant": lambda n, gen: torch.full((n,), 2.5),
    "zeros": lambda n, gen: torch.zeros(n),
    "lognormal": lambda n, gen: torch.randn(n, generator=gen).exp(),
}


@pytest.mark.parametrize("data", list(DATA))
def test_histogram_observer_matches_torch(data):
    """Histogram, range and qparams bit-identical over batches that widen the range."""
    gen = torch.Generator().manual_seed(3)
    # torch's search takes ~1e5 Python steps (about half a second) on degenerate histograms
    configs = HIST_CONFIGS[:4] if data in ("constant", "spiky") else HIST_CONFIGS
    for k, cfg in enumerate(configs):
        ours, theirs = _build((O.HistogramObserver, T.HistogramObserver), **cfg)
        for b in range(1 + k % 3):
            x = DATA[data]([300, 4000, 20000][(k + b) % 3], gen) * (1 + 0.6 * b)
            ours(x)
            theirs(x)
        _assert_same_buffers(ours, theirs, (data, cfg))
        _assert_same_qparams(ours, theirs, (data, cfg))


@pytest.mark.parametrize("bins,scale,widen", [(2048, 1.0, False), (1000, 1e-3, True), (7, 1e4, True),
                                              (2047, 3.3, False), (256, 1e-30, True)])
def test_fast_histc_equals_torch_histc(bins, scale, widen):
    """The chunked bincount path (inputs >= 1M elements) bins exactly like torch.histc,
    including values sitting on, just above and just below every bin edge."""
    gen = torch.Generator().manual_seed(bins)
    x = torch.randn(O._HISTC_MIN_NUMEL + 123, generator=gen) * scale + 2 * scale
    lo, hi = torch.aminmax(x)
    if widen:
        lo, hi = lo - 0.37 * scale, hi + 0.11 * scale
    edges = torch.linspace(lo.item(), hi.item(), bins + 1)
    up, down = torch.full_like(edges, float("inf")), torch.full_like(edges, float("-inf"))
    on_edges = torch.cat([edges, torch.nextafter(edges, up), torch.nextafter(edges, down),
                          lo + (hi - lo) * torch.arange(bins + 1) / bins]).clamp(lo, hi)
    x[:on_edges.numel()] = on_edges
    assert torch.equal(O._histc_of_covered(x, bins, lo, hi), torch.histc(x, bins, min=lo.item(), max=hi.item()))


def test_histogram_observer_matches_torch_on_large_batches():
    """Batches above the fast-histogram threshold, with the range widening between them."""
    gen = torch.Generator().manual_seed(7)
    ours, theirs = O.HistogramObserver(), T.HistogramObserver()
    for k in range(3):
        x = torch.randn(O._HISTC_MIN_NUMEL + 17 * k, generator=gen) ** 3 * (1 + k)
        ours(x)
        theirs(x)
        _assert_same_buffers(ours, theirs, k)
    _assert_same_qparams(ours, theirs, "large")


def test_histogram_spec_reference_numbers():
    torch.manual_seed(0)
    d = torch.randn(1000)
    o = O.HistogramObserver()
    o(d)
    s, z = o.calculate_qparams()
    assert o.min_val.item() == pytest.approx(-3.1537, abs=1e-4)
    assert o.max_val.item() == pytest.approx(4.1015, abs=1e-4)
    assert s.item() == pytest.approx(0.0284, abs=1e-4) and z.item() == 111
    sym = O.HistogramObserver(dtype=tq.qint8, qscheme=tq.per_tensor_symmetric)
    sym(d)
    s, z = sym.calculate_qparams()
    assert s.item() == pytest.approx(0.0321, abs=1e-4) and z.item() == 0


def test_histogram_quantization_errors_equal_torch_per_candidate():
    """The batched error expression equals torch's one-candidate-at-a-time version exactly."""
    x = torch.randn(5000) ** 3
    ours, theirs = O.HistogramObserver(), T.HistogramObserver()
    ours(x)
    theirs(x)
    gen = torch.Generator().manual_seed(1)
    starts = torch.randint(0, 1024, (40,), generator=gen).tolist()
    ends = torch.randint(1024, 2048, (40,), generator=gen).tolist()
    candidates = list(zip(starts, ends)) + [(0, 2047), (5, 5), (100, 101)]
    errors = ours._quantization_errors(candidates)
    assert errors == [theirs._compute_quantization_error(s, e) for s, e in candidates]


def test_histogram_single_point_then_wider_range():
    ours, theirs = O.HistogramObserver(), T.HistogramObserver()
    for x in [torch.full((10,), 1.5), torch.tensor([-2.0, 1.5, 4.0]), torch.randn(100)]:
        ours(x)
        theirs(x)
        _assert_same_buffers(ours, theirs, x)
    _assert_same_qparams(ours, theirs, "single point")


def test_histogram_refuses_inf_and_keeps_its_state():
    """[TQ] torch drops +-inf with a warning and the Inf flows on, surfacing later as NaN in
    another observer; ours raises, naming Inf, and leaves its statistics as they were."""
    ours, theirs = O.HistogramObserver(), T.HistogramObserver()
    finite = torch.tensor([1.0, -2.0, 0.5])
    ours(finite), theirs(finite)
    for x in (torch.tensor([1.0, float("inf"), -2.0, float("-inf"), 0.5]),
              torch.tensor([float("inf")])):
        with pytest.raises(ValueError, match="contains Inf"):
            ours(x)
        _assert_same_buffers(ours, theirs, "inf refused")


def test_histogram_nan_raises():
    with pytest.raises(ValueError, match="HistogramObserver.*NaN"):
        O.HistogramObserver()(torch.tensor([1.0, float("nan")]))


def test_histogram_dtype_limits_like_torch():
    assert O.HistogramObserver(dtype=tq.quint4x2).dst_nbins == T.HistogramObserver(dtype=torch.quint4x2).dst_nbins
    assert O.HistogramObserver(dtype=torch.int16).dst_nbins == 2**16
    with pytest.raises(TypeError, match="integer dtype"):
        O.HistogramObserver(dtype=torch.float8_e5m2)
    o = O.HistogramObserver(bins=16)
    o(torch.randn(10))
    o.bins = 32
    with pytest.raises(AssertionError, match="bins"):
        o.calculate_qparams()


# --------------------------------------------------------------------------------------------
# Bad input and construction errors
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [O.MinMaxObserver, O.MovingAverageMinMaxObserver,
                                 O.PerChannelMinMaxObserver, O.MovingAveragePerChannelMinMaxObserver])
@pytest.mark.parametrize("bad,stat", [(float("nan"), "min_val"), (float("inf"), "max_val"),
                                      (float("-inf"), "min_val")])
def test_non_finite_data_raises_naming_observer_and_statistic(cls, bad, stat):
    o = cls()
    good = torch.randn(3, 4)
    o(good)
    before = copy.deepcopy(o.state_dict())
    x = good.clone()
    x[1, 2] = bad
    with pytest.raises(ValueError, match=f"{cls.__name__}: the observed {stat} is not finite"):
        o(x)
    assert all(torch.equal(before[k], v) for k, v in o.state_dict().items())  # state untouched


@pytest.mark.parametrize("cls", [O.MinMaxObserver, O.MovingAverageMinMaxObserver, O.HistogramObserver,
                                 O.PerChannelMinMaxObserver, O.MovingAveragePerChannelMinMaxObserver])
def test_never_observed_returns_defaults_with_warning(cls):
    with pytest.warns(UserWarning, match="must run observer"):
        s, z = cls().calculate_qparams()
    assert s.tolist() == [1.0] and z.tolist() == [0]


@pytest.mark.filterwarnings("ignore:reduce_range is deprecated")
def test_construction_errors_keep_torch_exception_types():
    with pytest.raises(AssertionError, match="include 0"):
        O.MinMaxObserver(quant_min=1, quant_max=10)
    with pytest.raises(AssertionError, match="strictly less"):
        O.MinMaxObserver(quant_min=0, quant_max=0)
    with pytest.raises(AssertionError, match="bit range"):
        O.MinMaxObserver(dtype=tq.qint8, quant_min=-200, quant_max=100)
    with pytest.raises(NotImplementedError, match="MinMaxObserver supports per_tensor"):
        O.MinMaxObserver(qscheme=tq.per_channel_affine)
    with pytest.raises(NotImplementedError, match="per_channel"):
        O.PerChannelMinMaxObserver(qscheme=tq.per_tensor_affine)
    with pytest.raises(NotImplementedError, match="HistogramObserver"):
        O.HistogramObserver(qscheme=tq.per_channel_symmetric)
    with pytest.raises(NotImplementedError):
        O.MinMaxObserver(qscheme="not a qscheme")
    with pytest.raises(AssertionError, match="unsupported dtype"):
        O.MinMaxObserver(dtype=tq.quint2x4)
    with pytest.raises(AssertionError, match="unsupported dtype"):
        O.MinMaxObserver(dtype=torch.float32)
    for dtype in (tq.quint8, torch.uint8):  # torch forgets the torch.uint8 alias here
        with pytest.raises(NotImplementedError, match="reduce_range"):
            O.MinMaxObserver(dtype=dtype, qscheme=tq.per_tensor_symmetric, reduce_range=True)
        with pytest.raises(NotImplementedError, match="reduce_range"):
            O.PerChannelMinMaxObserver(dtype=dtype, qscheme=tq.per_channel_symmetric, reduce_range=True)
    with pytest.raises(NotImplementedError, match="dynamic"):
        O.MovingAverageMinMaxObserver(is_dynamic=True)
    O.MovingAverageMinMaxObserver(averaging_constant=1, is_dynamic=True)
    for cls in (O.PerChannelMinMaxObserver, O.HistogramObserver, O.FixedQParamsObserver.with_args(scale=0.1, zero_point=0)):
        with pytest.raises(NotImplementedError, match="dynamic"):
            cls(is_dynamic=True)
    with pytest.warns(UserWarning, match="reduce_range is deprecated"):
        O.MinMaxObserver(reduce_range=True)


def test_ch_axis_and_channel_count_errors():
    o = O.PerChannelMinMaxObserver(ch_axis=2)
    with pytest.raises(IndexError, match="ch_axis=2"):
        o(torch.randn(3, 4))
    with pytest.raises(IndexError, match="ch_axis"):
        O.PerChannelMinMaxObserver()(torch.tensor(1.0))
    o = O.MovingAveragePerChannelMinMaxObserver(ch_axis=1)
    o(torch.randn(3, 4))
    with pytest.raises(ValueError, match="5 channels along ch_axis=1.*recorded 4"):
        o(torch.randn(3, 5))


def test_per_channel_one_dim_input_is_one_value_per_channel():
    o = O.PerChannelMinMaxObserver()
    o(torch.tensor([1.0, -2.0, 3.0]))
    o(torch.tensor([0.5, -3.0, 4.0]))
    assert o.min_val.tolist() == [0.5, -3.0, 3.0] and o.max_val.tolist() == [1.0, -2.0, 4.0]


def test_reset_min_max_vals():
    o = O.MinMaxObserver()
    o(torch.randn(5))
    o.reset_min_max_vals()
    assert o.min_val.item() == float("inf") and o.max_val.item() == float("-inf")
    pc = O.PerChannelMinMaxObserver()
    pc(torch.randn(3, 4))
    pc.reset_min_max_vals()
    assert pc.min_val.numel() == 0
    pc(torch.randn(6, 2))  # a new channel count is fine after a reset
    assert pc.min_val.shape == (6,)


# --------------------------------------------------------------------------------------------
# State dicts, torch interop
# --------------------------------------------------------------------------------------------

STATE_PAIRS = [
    (O.MinMaxObserver, T.MinMaxObserver, {}),
    (O.MovingAverageMinMaxObserver, T.MovingAverageMinMaxObserver, {}),
    (O.PerChannelMinMaxObserver, T.PerChannelMinMaxObserver, {"ch_axis": 1}),
    (O.MovingAveragePerChannelMinMaxObserver, T.MovingAveragePerChannelMinMaxObserver, {}),
    (O.HistogramObserver, T.HistogramObserver, {"bins": 64}),
    (O.FixedQParamsObserver, T.FixedQParamsObserver, {"scale": 0.25, "zero_point": 3}),
]


@pytest.mark.parametrize("ours_cls,torch_cls,kwargs", STATE_PAIRS)
def test_state_dict_loads_both_ways(ours_cls, torch_cls, kwargs):
    x = torch.randn(4, 6)
    src_t, src_o = torch_cls(**kwargs), ours_cls(**kwargs)
    src_t(x)
    src_o(x)
    assert list(src_o.state_dict()) == list(src_t.state_dict())
    # torch -> ours, through torch.save / weights_only load
    buf = io.BytesIO()
    torch.save(src_t.state_dict(), buf)
    buf.seek(0)
    dst_o = ours_cls(**kwargs)
    dst_o.load_state_dict(torch.load(buf, weights_only=True))
    _assert_same_buffers(dst_o, src_t, "torch->ours")
    _assert_same_qparams(dst_o, src_t, "torch->ours")
    # ours -> torch
    dst_t = torch_cls(**kwargs)
    dst_t.load_state_dict(src_o.state_dict())
    _assert_same_buffers(src_o, dst_t, "ours->torch")


def test_legacy_state_dict_versions():
    # v1 had no eps buffer: the default is used
    o = O.MinMaxObserver(eps=2**-12)
    sd = O.MinMaxObserver().state_dict()
    del sd["eps"]
    sd._metadata[""]["version"] = 1
    o.load_state_dict(sd)
    assert o.eps.item() == torch.finfo(torch.float32).eps
    # v2 per-channel buffers were called min_vals / max_vals
    pc = O.PerChannelMinMaxObserver()
    sd = pc.state_dict()
    sd["min_vals"], sd["max_vals"] = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 3.0])
    del sd["min_val"], sd["max_val"]
    sd._metadata[""]["version"] = 2
    pc.load_state_dict(sd)
    assert pc.min_val.tolist() == [-1.0, -2.0] and pc.max_val.tolist() == [1.0, 3.0]
    # v2 histogram observers stored an unset min/max as an empty tensor
    h = O.HistogramObserver(bins=8)
    sd = h.state_dict()
    sd["min_val"], sd["max_val"] = torch.tensor([]), torch.tensor([])
    sd._metadata[""]["version"] = 2
    h.load_state_dict(sd)
    assert h.min_val.item() == float("inf") and h.max_val.item() == float("-inf")


class _Observed(torch.nn.Module):
    def __init__(self, ns):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 1)
        self.conv.activation_post_process = ns.HistogramObserver(bins=32)
        self.weight_fake = torch.nn.Module()
        self.weight_fake.activation_post_process = ns.PerChannelMinMaxObserver()
        self.activation_post_process = ns.MinMaxObserver()

    def forward(self, x):
        y = self.conv.activation_post_process(self.conv(x))
        self.weight_fake.activation_post_process(self.conv.weight)
        return self.activation_post_process(y)


@pytest.mark.parametrize("source", [O, T])
def test_get_and_load_observer_state_dict(source):
    src = _Observed(source)
    src(torch.randn(2, 2, 4, 4))
    state = (O if source is O else T).get_observer_state_dict(src)
    assert all("activation_post_process" in k for k in state) and "conv.weight" not in state
    assert hasattr(state, "_metadata")
    dst = _Observed(O)
    O.load_observer_state_dict(dst, state)
    for key, value in state.items():
        assert torch.equal(dst.state_dict()[key], value), key
    assert dst.conv.weight.shape == src.conv.weight.shape  # untouched
    _assert_same_qparams(dst.weight_fake.activation_post_process,
                         src.weight_fake.activation_post_process, "per channel")
    # and torch's loader accepts ours
    back = _Observed(T)
    T.load_observer_state_dict(back, O.get_observer_state_dict(dst))
    _assert_same_qparams(dst.conv.activation_post_process, back.conv.activation_post_process, "hist")


@pytest.mark.parametrize("source", ["torchquant", "torch"])
def test_load_observer_state_dict_covers_fake_quantize_modules(source):
    from torch.ao.quantization import fake_quantize as torch_fq
    from torchquant.quantization import fake_quantize as tq_fq

    def model(fq):
        m = torch.nn.Sequential(torch.nn.Linear(3, 3))
        m[0].activation_post_process = fq.FakeQuantize(observer=(O if fq is tq_fq else T).MinMaxObserver)
        return m

    src = model(tq_fq if source == "torchquant" else torch_fq)
    src[0].activation_post_process(torch.randn(4, 3) * 2)
    src[0].activation_post_process.calculate_qparams()
    state = (O if source == "torchquant" else T).get_observer_state_dict(src)
    dst = model(tq_fq)
    O.load_observer_state_dict(dst, state)
    for key, value in state.items():
        assert torch.equal(dst.state_dict()[key], value), key


def test_load_observer_state_dict_reports_missing_and_unexpected_keys():
    model = _Observed(O)
    model(torch.randn(1, 2, 4, 4))
    state = O.get_observer_state_dict(model)
    missing = copy.copy(state)
    del missing["activation_post_process.min_val"]
    with pytest.raises(RuntimeError, match="Missing keys for observer activation_post_process.min_val"):
        O.load_observer_state_dict(_Observed(O), missing)
    extra = copy.copy(state)
    extra["activation_post_process.bogus"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match="Unexpected keys for observer activation_post_process.bogus"):
        O.load_observer_state_dict(_Observed(O), extra)
    plain = dict(state)  # no version metadata: read as the current format, eps kept
    model.activation_post_process.eps.fill_(0.5)
    plain["activation_post_process.eps"] = torch.tensor([0.5])
    fresh = _Observed(O)
    O.load_observer_state_dict(fresh, plain)
    assert fresh.activation_post_process.eps.item() == 0.5


# --------------------------------------------------------------------------------------------
# Factories, defaults, trivial observers
# --------------------------------------------------------------------------------------------

def test_with_args_and_callable_args():
    factory = O.MinMaxObserver.with_args(dtype=tq.qint8).with_args(quant_min=-5, quant_max=5)
    a, b = factory(), factory()
    assert a is not b and a.dtype is tq.qint8 and (a.quant_min, a.quant_max) == (-5, 5)
    assert "MinMaxObserver" in repr(factory) and "quant_min" in repr(factory)
    counter = iter(range(100))
    built = O.FixedQParamsObserver.with_callable_args(zero_point=lambda: next(counter)).with_args(scale=0.5)
    assert [built().zero_point.item() for _ in range(3)] == [0, 1, 2]
    assert built(zero_point=7).zero_point.item() == 7  # explicit keyword wins, callable not called
    assert built().zero_point.item() == 3
    assert isinstance(factory, O._PartialWrapper) and factory.callable_args == {}


def _settings_of(o):
    keys = ["dtype", "qscheme", "quant_min", "quant_max", "is_dynamic", "reduce_range", "ch_axis",
            "bins", "has_customized_qrange"]
    out = {k: getattr(o, k) for k in keys if hasattr(o, k)}
    for name in ("eps", "scale", "zero_point"):
        if hasattr(o, name):
            value = getattr(o, name)
            out[name] = value.tolist() if isinstance(value, torch.Tensor) else value
    return out


@pytest.mark.parametrize("name", [n for n in O.__all__ if n.startswith(("default_", "weight_", "per_channel_weight"))])
def test_default_factories_match_torch(name):
    ours, theirs = getattr(O, name)(), getattr(T, name)()
    assert type(ours).__name__ == type(theirs).__name__
    a, b = _settings_of(ours), _settings_of(theirs)
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), (a, b)


def test_default_aliases():
    assert O.default_symmetric_fixed_qparams_observer is O.default_fixed_qparams_range_neg1to1_observer
    assert O.default_affine_fixed_qparams_observer is O.default_fixed_qparams_range_0to1_observer
    assert O.default_placeholder_observer is O.PlaceholderObserver
    assert O.default_debug_observer is O.RecordingObserver
    assert O.default_reuse_input_observer is O.ReuseInputObserver


def test_configuration_only_observers():
    x = torch.randn(3)
    p = O.PlaceholderObserver(dtype=tq.quint8, quant_min=0, quant_max=255, is_dynamic=True)
    assert p(x) is x and p.qscheme is tq.per_tensor_affine and p.eps == torch.finfo(torch.float32).eps
    assert repr(p) == "PlaceholderObserver(dtype=torchquant.quint8, is_dynamic=True)"
    with pytest.warns(UserWarning, match="compute_dtype"):
        assert O.PlaceholderObserver(compute_dtype=tq.quint8).is_dynamic
    r = O.RecordingObserver()
    r(x)
    r(x * 2)
    assert torch.equal(r.get_tensor_value()[1], x * 2) and r.get_tensor_value()[0] is not x
    n = O.NoopObserver()
    assert n(x) is x and n.dtype is torch.float16
    u = O.ReuseInputObserver()
    assert u(x) is x and u.dtype is tq.quint8
    for o in (p, r, n, u):
        with pytest.raises(RuntimeError, match="should not be called"):
            o.calculate_qparams()
    f = O.FixedQParamsObserver(scale=1.0 / 256, zero_point=0)
    assert f(x) is x
    s, z = f.calculate_qparams()
    assert s.dtype == torch.float32 and z.dtype == torch.int32 and s.tolist() == [1.0 / 256]
    with pytest.raises(ValueError, match="scale"):
        O.FixedQParamsObserver(scale=0.0, zero_point=0)
    with pytest.raises(NotImplementedError, match="per_tensor_affine and per_tensor_symmetric only"):
        O.FixedQParamsObserver(scale=0.1, zero_point=0, qscheme=tq.per_channel_affine)


def test_abstract_base_and_kwargs():
    with pytest.raises(TypeError):
        O.ObserverBase(tq.quint8)
    with pytest.raises(TypeError):
        O.MinMaxObserver(not_an_argument=1)  # like torch: extra kwargs end at nn.Module
    class Minimal(O.UniformQuantizationObserverBase):
        def forward(self, x):
            return x

        def calculate_qparams(self):
            return self._calculate_qparams(torch.tensor(-1.0), torch.tensor(1.0))

    m = Minimal()
    ref = T.MinMaxObserver()
    ref(torch.tensor([-1.0, 1.0]))
    assert [t.tolist() for t in m.calculate_qparams()] == [t.tolist() for t in ref.calculate_qparams()]
    with pytest.raises(NotImplementedError, match="cannot reset"):
        m.reset_min_max_vals()


def test_fx_traces_observers_as_leaf_modules():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.obs = O.HistogramObserver(bins=32)
            self.wobs = O.PerChannelMinMaxObserver()

        def forward(self, x):
            self.wobs(self.fc.weight)
            return self.obs(self.fc(x))

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, O.ObserverBase) or super().is_leaf_module(m, qualname)

    net = Net()
    gm = torch.fx.GraphModule(net, Tracer().trace(net))
    assert {n.target for n in gm.graph.nodes if n.op == "call_module"} == {"fc", "obs", "wobs"}
    x = torch.randn(2, 4)
    assert torch.equal(gm(x), net.fc(x))
    assert gm.obs.min_val.item() != float("inf") and gm.wobs.min_val.numel() == 4


def test_deepcopy_and_pickle():
    o = O.HistogramObserver(bins=16, dtype=tq.qint8)
    o(torch.randn(20))
    c = copy.deepcopy(o)
    assert c.dtype is tq.qint8 and torch.equal(c.histogram, o.histogram)
    buf = io.BytesIO()
    torch.save(o, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded.dtype is tq.qint8 and torch.equal(loaded.calculate_qparams()[0], o.calculate_qparams()[0])
