"""Calibration and QAT across processes: sync_observers, observe_across_ranks, DDP QAT.

Two local ranks joined by gloo (torchquant.examples.distributed.spawn: free port, collective
timeouts, an overall deadline), three spawns in all.  The ranks save what they saw under a temp
folder and the assertions run here, against one process that observed all the data (itself
checked bit-exactly against torch.ao by tests/quantization/test_observer.py; the min/max
observers are also compared with torch.ao directly below).
"""
from __future__ import annotations

import copy
import math
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

import torchquant.quantization as tq
from torchquant.examples import digits
from torchquant.examples.distributed import spawn
from torchquant.quantization import fake_quantize as fq
from torchquant.quantization import observer as obs

WORLD = 2
DEADLINE_S = 240  # a hung rank fails the test instead of the whole run


def _batches() -> list[torch.Tensor]:
    """Six batches of different ranges; rank r calibrates on batches r, r + 2, r + 4."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 3, 4, 4, generator=g) * (1 + i) + 0.3 * i for i in range(6)]


def _shared_range_batches() -> list[torch.Tensor]:
    """As _batches, but the first batch of each rank (and of the whole stream) holds the global
    min and max: no histogram ever changes range, so merged histograms are exact."""
    batches = [b.clone() for b in _batches()]
    lo = min(b.min() for b in batches) - 1.0
    hi = max(b.max() for b in batches) + 1.0
    for b in batches[:WORLD]:
        b.view(-1)[0], b.view(-1)[1] = lo, hi
    return batches


def _observers() -> dict[str, nn.Module]:
    return {
        "minmax": obs.MinMaxObserver(),
        "symmetric": obs.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
        "per_channel": obs.PerChannelMinMaxObserver(ch_axis=1, dtype=torch.qint8,
                                                    qscheme=torch.per_channel_symmetric),
        "histogram": obs.HistogramObserver(),
        "histogram_wide": obs.HistogramObserver(),
        "moving_average_1": obs.MovingAverageMinMaxObserver(averaging_constant=1.0),
        "moving_average": obs.MovingAverageMinMaxObserver(averaging_constant=0.01),
        # memoryless fake quants: merged exactly (moving averages with a memory cannot be)
        "fake_quant": fq.default_fake_quant(averaging_constant=1.0),
        "fused_fake_quant": fq.default_fused_per_channel_wt_fake_quant(ch_axis=1,
                                                                       averaging_constant=1.0),
        # rank 1 sees nothing / only zeros
        "empty_rank": obs.MinMaxObserver(),
        "empty_rank_per_channel": obs.PerChannelMinMaxObserver(ch_axis=1),
        "empty_rank_histogram": obs.HistogramObserver(),
        "zeros_rank": obs.MinMaxObserver(),
        "zeros_rank_histogram": obs.HistogramObserver(),
        "all_zeros": obs.MinMaxObserver(),
    }


def _feed(observers: dict[str, nn.Module], batches: list[torch.Tensor],
          shared: list[torch.Tensor], rank: int | None) -> None:
    """Calibrate: rank None is the single process that sees everything."""
    mine = batches if rank is None else batches[rank::WORLD]
    mine_shared = shared if rank is None else shared[rank::WORLD]
    for name, module in observers.items():
        if name == "histogram":
            data = mine_shared
        elif name in ("moving_average_1", "fake_quant", "fused_fake_quant"):  # memoryless: the state is the last batch (of all)
            data = [torch.cat(batches[-WORLD:])] if rank is None else [batches[-WORLD + rank]]
        elif name.startswith("empty_rank"):
            data = mine if rank != 1 else [torch.empty(0, 3, 4, 4)]
            if rank is None:
                data = batches[0::WORLD]
        elif name.startswith("zeros_rank"):
            data = mine if rank != 1 else [torch.zeros(8, 3, 4, 4)]
            if rank is None:
                data = batches[0::WORLD] + [torch.zeros(8, 3, 4, 4)]
        elif name == "all_zeros":
            data = [torch.zeros(8, 3, 4, 4)]
        else:
            data = mine
        for batch in data:
            module(batch)


def _qparams(observers: dict[str, nn.Module]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: tuple(t.clone() for t in m.calculate_qparams()) for name, m in observers.items()}


def _sync_worker(rank: int, world: int, out: str) -> None:
    batches, shared = _batches(), _shared_range_batches()
    observers = _observers()
    _feed(observers, batches, shared, rank)
    model = nn.ModuleDict(observers)
    before = _qparams(observers)
    average_before = (observers["moving_average"].min_val.clone(),
                      observers["moving_average"].max_val.clone())
    tq.sync_observers(model)
    after = _qparams(observers)
    average_after = (observers["moving_average"].min_val.clone(),
                     observers["moving_average"].max_val.clone())
    fake_quant_buffers = {name: (m.scale.clone(), m.zero_point.clone())
                          for name, m in observers.items() if isinstance(m, fq.FakeQuantizeBase)}

    # Per-step sync: rank r feeds batch 2i + r at step i; the reference feeds both at once.
    stepped = nn.ModuleDict(_per_step_observers())
    tq.observe_across_ranks(stepped)
    for batch in batches[rank::world]:
        for module in stepped.values():
            module(batch)
    # Per-step sync where rank 1's batch is empty at some steps (an uneven last batch).
    stepped_empty = nn.ModuleDict(_per_step_observers(with_per_channel=True))
    tq.observe_across_ranks(stepped_empty)
    for batch in _empty_shard_steps(batches, rank):
        for module in stepped_empty.values():
            module(batch)
    models = {}
    for kind in ("qat", "ptq"):
        model = _empty_shard_model(kind)
        for x in _empty_shard_model_inputs(rank):
            model(x)
        models[kind] = {k: v.clone() for k, v in model.state_dict().items()}

    # a NaN held by one rank's observer is named, on every rank, instead of being dropped
    poisoned = nn.ModuleDict({"clean": obs.MinMaxObserver(), "poisoned": obs.MinMaxObserver()})
    for module in poisoned.values():
        module(batches[rank])
    if rank == 1:
        poisoned["poisoned"].min_val.fill_(math.nan)
    try:
        tq.sync_observers(poisoned)
        nan_message = "no error"
    except ValueError as exc:
        nan_message = str(exc)
    torch.save({"before": before, "after": after, "fake_quant_buffers": fake_quant_buffers,
                "average_before": average_before, "average_after": average_after,
                "stepped": {k: v.clone() for k, v in stepped.state_dict().items()},
                "stepped_empty": {k: v.clone() for k, v in stepped_empty.state_dict().items()},
                "empty_shard_models": models, "nan_message": nan_message},
               os.path.join(out, f"rank{rank}.pt"))


def _empty_shard_steps(batches: list[torch.Tensor], rank: int | None) -> list[torch.Tensor]:
    """Three steps; rank 1's batch is empty at the first and last (rank None: one process
    that sees each step's batches concatenated)."""
    empty = torch.empty(0, 3, 4, 4)
    per_rank = [[batches[0], batches[2], batches[4]], [empty, batches[3], empty]]
    if rank is not None:
        return per_rank[rank]
    return [torch.cat([per_rank[0][i], per_rank[1][i]]) for i in range(3)]


def _empty_shard_model(kind: str) -> nn.Module:
    """The issue's setup: QAT with the default x86 qconfig, or PTQ with MinMax observers,
    both with per-step sync."""
    torch.manual_seed(0)
    model = nn.Sequential(tq.QuantStub(), nn.Linear(8, 4), nn.ReLU(), tq.DeQuantStub())
    if kind == "qat":
        model.train().qconfig = tq.get_default_qat_qconfig("x86")
        return tq.prepare_qat(model, sync_across_ranks=True)
    model.eval().qconfig = tq.default_qconfig
    return tq.prepare(model, sync_across_ranks=True)


def _empty_shard_model_inputs(rank: int | None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    per_rank = [[torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)],
                [torch.randn(0, 8), torch.randn(4, 8, generator=g) * 3]]
    if rank is not None:
        return per_rank[rank]
    return [torch.cat([per_rank[0][i], per_rank[1][i]]) for i in range(2)]


def _per_step_observers(with_per_channel: bool = False) -> dict[str, nn.Module]:
    observers = {
        "minmax": obs.MinMaxObserver(),
        "moving_average": obs.MovingAverageMinMaxObserver(averaging_constant=0.1),
        "per_channel_moving_average": obs.MovingAveragePerChannelMinMaxObserver(
            averaging_constant=0.1, ch_axis=1, dtype=torch.qint8,
            qscheme=torch.per_channel_symmetric),
        "histogram": obs.HistogramObserver(),
        "fake_quant": fq.default_fake_quant(),
        "fused_fake_quant": fq.default_fused_act_fake_quant(),
    }
    if with_per_channel:
        observers["per_channel"] = obs.PerChannelMinMaxObserver(ch_axis=1)
        observers["fused_per_channel"] = fq.default_fused_per_channel_wt_fake_quant(ch_axis=1)
    return observers


@pytest.fixture(scope="module")
def synced(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sync"))
    spawn(_sync_worker, WORLD, (out,), timeout_s=DEADLINE_S)
    ranks = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]
    single = _observers()
    _feed(single, _batches(), _shared_range_batches(), None)
    return ranks, single


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


EXACT = ["minmax", "symmetric", "per_channel", "moving_average_1", "empty_rank",
         "empty_rank_per_channel", "zeros_rank", "all_zeros", "fake_quant", "fused_fake_quant"]


def test_ranks_agree_after_sync_and_not_before(synced):
    ranks, _ = synced
    for name in _observers():
        assert _equal(ranks[0]["after"][name], ranks[1]["after"][name]), name
    # the bug users have without the sync: each rank's qparams describe its own shard only
    for name in ["minmax", "symmetric", "per_channel", "histogram_wide", "fake_quant"]:
        assert not _equal(ranks[0]["before"][name], ranks[1]["before"][name]), name


@pytest.mark.parametrize("name", EXACT)
def test_min_max_sync_equals_one_process_on_all_data(synced, name):
    ranks, single = synced
    expected = single[name].calculate_qparams()
    for rank in ranks:
        assert _equal(rank["after"][name], expected), (name, rank["after"][name], expected)


def test_min_max_sync_matches_torch_ao():
    """The single-process reference itself, against torch.ao on the concatenated data."""
    from torch.ao.quantization import observer as ao
    data = torch.cat(_batches())
    for ours, theirs in ((obs.MinMaxObserver(), ao.MinMaxObserver()),
                         (obs.PerChannelMinMaxObserver(ch_axis=1), ao.PerChannelMinMaxObserver(ch_axis=1))):
        ours(data), theirs(data)
        assert all(torch.equal(a, b) for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams()))


def test_moving_average_takes_the_widest_rank_average(synced):
    """With a memory (averaging_constant < 1) no exact merge exists; the documented rule."""
    ranks, _ = synced
    lows = torch.stack([r["average_before"][0] for r in ranks])
    highs = torch.stack([r["average_before"][1] for r in ranks])
    for rank in ranks:
        assert torch.equal(rank["average_after"][0], lows.min(0).values)
        assert torch.equal(rank["average_after"][1], highs.max(0).values)


def test_histogram_sync_equals_one_process(synced):
    ranks, single = synced
    scale, zero_point = single["histogram"].calculate_qparams()
    for rank in ranks:
        got_scale, got_zero_point = rank["after"]["histogram"]
        torch.testing.assert_close(got_scale, scale, rtol=1e-6, atol=0)
        assert torch.equal(got_zero_point, zero_point)


def test_histogram_with_different_ranges_is_close(synced):
    """Shards with different ranges: each rank's histogram is re-binned onto the global range,
    the approximation one process makes when a batch widens its range, but at other points of
    the stream, so the search may settle a bin or two apart (2048 bins: ~1e-3 of the range)."""
    ranks, single = synced
    scale, zero_point = single["histogram_wide"].calculate_qparams()
    got_scale, got_zero_point = ranks[0]["after"]["histogram_wide"]
    torch.testing.assert_close(got_scale, scale, rtol=5e-3, atol=0)
    assert abs(int(got_zero_point) - int(zero_point)) <= 1


@pytest.mark.parametrize("name", ["empty_rank", "empty_rank_per_channel", "empty_rank_histogram",
                                  "zeros_rank", "zeros_rank_histogram", "all_zeros"])
def test_empty_or_zero_ranks_give_valid_qparams(synced, name):
    ranks, _ = synced
    for rank in ranks:
        scale, zero_point = rank["after"][name]
        assert bool(torch.isfinite(scale).all()) and bool((scale > 0).all())
        assert bool(((zero_point >= 0) & (zero_point <= 255)).all())
    # the empty rank now holds what the others saw
    assert _equal(ranks[1]["after"][name], ranks[0]["after"][name])


def test_fake_quant_buffers_follow_the_merged_observer(synced):
    ranks, single = synced
    for rank in ranks:
        for name, (scale, zero_point) in rank["fake_quant_buffers"].items():
            assert torch.equal(scale, single[name].scale), name
            assert torch.equal(zero_point, single[name].zero_point), name


def test_per_step_sync_equals_one_process_on_concatenated_batches(synced):
    ranks, _ = synced
    reference = nn.ModuleDict(_per_step_observers())
    batches = _batches()
    for step in range(0, len(batches), WORLD):
        joined = torch.cat(batches[step:step + WORLD])
        for module in reference.values():
            module(joined)
    expected = reference.state_dict()
    for rank in ranks:
        assert expected.keys() == rank["stepped"].keys()
        for key, value in expected.items():
            assert torch.equal(rank["stepped"][key], value), key


def test_per_step_sync_with_an_empty_shard_equals_one_process(synced):
    """Rank 1's batch is empty at some steps: it still joins every reduction (no collective
    mismatch, no uncalibrated rank) and all ranks equal one process on the non-empty data."""
    ranks, _ = synced
    reference = nn.ModuleDict(_per_step_observers(with_per_channel=True))
    for batch in _empty_shard_steps(_batches(), None):
        for module in reference.values():
            module(batch)
    expected = reference.state_dict()
    for rank in ranks:
        assert expected.keys() == rank["stepped_empty"].keys()
        for key, value in expected.items():
            assert torch.equal(rank["stepped_empty"][key], value), key


@pytest.mark.parametrize("kind", ["qat", "ptq"])
def test_prepare_with_sync_and_an_empty_shard_equals_one_process(synced, kind):
    ranks, _ = synced
    reference = _empty_shard_model(kind)
    for x in _empty_shard_model_inputs(None):
        reference(x)
    expected = reference.state_dict()
    for rank in ranks:
        got = rank["empty_shard_models"][kind]
        assert expected.keys() == got.keys()
        for key, value in expected.items():
            assert torch.equal(got[key], value), (kind, key)


def test_sync_observers_names_the_rank_and_module_holding_nan(synced):
    ranks, _ = synced
    for rank in ranks:
        assert "rank 1" in rank["nan_message"] and "'poisoned'" in rank["nan_message"], \
            rank["nan_message"]
        assert "NaN" in rank["nan_message"]


def test_without_process_group_the_tools_do_nothing():
    model = nn.ModuleDict({"o": obs.MinMaxObserver()})
    model["o"](torch.arange(4.0))
    assert tq.sync_observers(model) is model
    tq.observe_across_ranks(model)
    assert "_rank_sync" not in model["o"].__dict__
    assert model["o"].max_val.item() == 3.0


# ---- a dead rank --------------------------------------------------------------------------

def _dead_rank_worker(rank: int, world: int, out: str) -> None:
    if rank == 1:
        return  # leaves without syncing (as if it crashed)
    model = nn.ModuleDict({"o": obs.MinMaxObserver()})
    model["o"](torch.ones(3))
    try:
        tq.sync_observers(model)
        message = "no error"
    except RuntimeError as exc:
        message = str(exc)
    with open(os.path.join(out, "rank0.txt"), "w") as f:
        f.write(message)


def test_a_dead_rank_ends_the_others_with_a_clear_error(tmp_path):
    spawn(_dead_rank_worker, WORLD, (str(tmp_path),), timeout_s=DEADLINE_S, collective_timeout_s=10)
    message = (tmp_path / "rank0.txt").read_text()
    assert "failed on rank 0" in message and "died" in message, message


# ---- DDP QAT ------------------------------------------------------------------------------

QAT_STEPS = 6
BATCH = 32  # the exported (PT2E) graph has a fixed batch size


def _fake_quant_qparams(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v.detach().clone() for name, m in model.named_modules()
            if isinstance(m, fq.FakeQuantizeBase) for k, v in (("scale", m.scale),
                                                                ("zero_point", m.zero_point))}


def _train_ddp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int,
               freeze_bn=None) -> list[dict]:
    """A few Adam steps on this rank's shard under DDP; BN statistics frozen for the last
    steps so the ranks' BN buffers end equal (DDP broadcasts rank 0's before each forward)."""
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    steps = []
    for step in range(QAT_STEPS):
        if step == QAT_STEPS - 2:
            if freeze_bn is None:
                model.apply(_freeze_bn)
            else:
                freeze_bn(model)
        idx = torch.randint(len(y), (BATCH,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x[idx]), y[idx]).backward()
        opt.step()
        steps.append(_fake_quant_qparams(model))
    return steps


def _freeze_bn(m: nn.Module) -> None:
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        m.eval()
    if hasattr(m, "freeze_bn_stats"):
        m.freeze_bn_stats()


def _qat_worker(rank: int, world: int, out: str, float_state: dict) -> None:
    torch.manual_seed(0)
    x_tr, y_tr, x_te, y_te = digits.load_data()
    x, y = x_tr[rank::world], y_tr[rank::world]
    float_model = digits.DigitsCNN()
    float_model.load_state_dict(float_state)
    result = {}

    # eager: fuse, prepare_qat with per-step observer sync, DDP
    eager = tq.fuse_modules_qat(copy.deepcopy(float_model).train(), digits.FUSE_PATTERNS)
    eager.qconfig = tq.get_default_qat_qconfig("x86")
    tq.prepare_qat(eager, inplace=True, sync_across_ranks=True)
    result["eager_steps"] = _train_ddp(eager, x, y, rank)
    result["eager_state"] = {k: v.clone() for k, v in eager.state_dict().items()}
    converted = tq.convert(copy.deepcopy(eager).eval())
    with torch.no_grad():
        result["eager_logits"] = converted(x_te)
    result["eager_accuracy"] = digits.accuracy(converted, x_te, y_te)

    # SyncBatchNorm inside the QAT ConvBn modules: torch's SyncBatchNorm trains on GPU only, so
    # here the conversion, an eval forward and convert are checked (same result as plain BN).
    synced_bn = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(eager))
    result["sync_bn_types"] = sorted({type(m.bn).__name__ for m in synced_bn.modules() if hasattr(m, "bn")})
    with torch.no_grad():
        result["sync_bn_logits"] = tq.convert(synced_bn.eval())(x_te)

    # FX
    from torchquant.quantization.quantize_fx import convert_fx, prepare_qat_fx
    fx_model = prepare_qat_fx(copy.deepcopy(float_model).train(),
                              tq.get_default_qat_qconfig_mapping("x86"), (x[:2],),
                              sync_across_ranks=True)
    result["fx_steps"] = _train_ddp(fx_model, x, y, rank)
    with torch.no_grad():
        result["fx_logits"] = convert_fx(copy.deepcopy(fx_model).eval())(x_te)

    # PT2E
    from torchquant.quantization.pt2e.export_utils import move_exported_model_to_eval
    from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    from torchquant.quantization.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    exported = torch.export.export(copy.deepcopy(float_model).train(), (x[:BATCH],)).module()
    quantizer = X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(is_qat=True))
    pt2e_model = prepare_qat_pt2e(exported, quantizer, sync_across_ranks=True)
    # exported graphs have no BN modules: eval mode is how their BN statistics freeze
    result["pt2e_steps"] = _train_ddp(pt2e_model, x, y, rank, move_exported_model_to_eval)
    pt2e_model = convert_pt2e(copy.deepcopy(pt2e_model))
    with torch.no_grad():
        result["pt2e_logits"] = torch.cat([pt2e_model(b) for b in x_te[:len(x_te) // BATCH * BATCH].split(BATCH)])
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def ddp_qat(tmp_path_factory):
    data = digits.load_data()
    float_model = digits.trained_float_model(data)
    out = str(tmp_path_factory.mktemp("qat"))
    spawn(_qat_worker, WORLD, (out, float_model.state_dict()), timeout_s=DEADLINE_S)
    ranks = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]
    return ranks, digits.accuracy(float_model, data[2], data[3])


@pytest.mark.parametrize("workflow", ["eager", "fx", "pt2e"])
def test_ddp_qat_qparams_identical_on_all_ranks_every_step(ddp_qat, workflow):
    ranks, _ = ddp_qat
    steps0, steps1 = ranks[0][f"{workflow}_steps"], ranks[1][f"{workflow}_steps"]
    assert len(steps0) == QAT_STEPS and steps0[0], workflow
    for step, (a, b) in enumerate(zip(steps0, steps1)):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (workflow, step, key)
    # and they moved: the observers kept observing during training
    assert any(not torch.equal(steps0[0][k], steps0[-1][k]) for k in steps0[0])


@pytest.mark.parametrize("workflow", ["eager", "fx", "pt2e"])
def test_ddp_qat_converts_the_same_on_every_rank(ddp_qat, workflow):
    ranks, _ = ddp_qat
    assert torch.equal(ranks[0][f"{workflow}_logits"], ranks[1][f"{workflow}_logits"])


def test_ddp_qat_weights_identical_and_accuracy_kept(ddp_qat):
    ranks, float_accuracy = ddp_qat
    a, b = ranks[0]["eager_state"], ranks[1]["eager_state"]
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert ranks[0]["eager_accuracy"] >= float_accuracy - 0.5


def test_sync_batchnorm_in_qat_conv_bn_modules(ddp_qat):
    ranks, _ = ddp_qat
    assert ranks[0]["sync_bn_types"] == ["SyncBatchNorm"]
    assert torch.equal(ranks[0]["sync_bn_logits"], ranks[0]["eager_logits"])
