"""fuse_modules / fuse_modules_qat against torch.ao's: the same module types in the same
places, and (eval) the same folded weights -- both fold BN with torch.nn.utils.fusion, so
the folded float weights are bit-identical."""
import pytest
import torch
import torch.ao.quantization as ao_q
from torch import nn

import torchquant.nn.intrinsic as nni
import torchquant.quantization as tqq
from torchquant.quantization.fuser_method_mappings import get_fuser_method


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.relu2 = nn.ReLU()
        self.sub = nn.Sequential(nn.Conv1d(2, 4, 1), nn.BatchNorm1d(4))
        self.fc = nn.Linear(8, 4)
        self.fc_bn = nn.BatchNorm1d(4)
        self.bn3 = nn.BatchNorm2d(8)
        self.relu3 = nn.ReLU()
        self.deconv = nn.ConvTranspose2d(8, 8, 2)
        self.deconv_bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.relu2(self.conv2(self.relu(self.bn(self.conv(x)))))


GROUPS = [["conv", "bn", "relu"], ["conv2", "relu2"], ["sub.0", "sub.1"], ["fc", "fc_bn"],
          ["bn3", "relu3"], ["deconv", "deconv_bn"]]


def randomized_block():
    torch.manual_seed(0)
    block = Block()
    for m in block.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return block.eval()


def test_eval_fusion_matches_torch():
    block = randomized_block()
    theirs = ao_q.fuse_modules(block, GROUPS)
    ours = tqq.fuse_modules(block, GROUPS)
    assert isinstance(block.bn, nn.BatchNorm2d)  # not inplace: the input is untouched
    for name, mod in ours.named_modules():
        their_mod = theirs.get_submodule(name)
        assert type(mod).__name__ == type(their_mod).__name__, name
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), name
    assert isinstance(ours.conv, nni.ConvReLU2d) and isinstance(ours.bn, nn.Identity)
    x = torch.randn(2, 3, 10, 10)
    torch.testing.assert_close(ours(x), block(x), rtol=1e-5, atol=1e-5)


def test_qat_fusion_keeps_bn():
    block = randomized_block().train()
    fused = tqq.fuse_modules_qat(block, GROUPS[:5])
    assert isinstance(fused.conv, nni.ConvBnReLU2d)
    assert isinstance(fused.sub[0], nni.ConvBn1d)
    assert isinstance(fused.fc, nni.LinearBn1d)
    assert isinstance(fused.bn3, nni.BNReLU2d)
    with pytest.raises(Exception, match="ConvTranspose"):
        tqq.fuse_modules_qat(block, ["deconv", "deconv_bn"])


def test_inplace_and_hooks_move():
    block = randomized_block()
    calls = []
    block.conv.register_forward_pre_hook(lambda m, i: calls.append("pre"))
    block.relu.register_forward_hook(lambda m, i, o: calls.append("post"))
    out = tqq.fuse_modules(block, ["conv", "bn", "relu"], inplace=True)
    assert out is block and isinstance(block.conv, nni.ConvReLU2d)
    block(torch.randn(1, 3, 8, 8))
    assert calls == ["pre", "post"]


def test_bad_fusions_raise():
    block = randomized_block()
    with pytest.raises(AttributeError, match="nope"):
        tqq.fuse_modules(block, ["conv", "nope"])
    with pytest.raises(NotImplementedError, match="Cannot fuse modules"):
        tqq.fuse_modules(block, ["relu", "conv"])
    train_block = randomized_block().train()
    train_block.bn.eval()
    with pytest.raises(AssertionError, match="same mode"):
        tqq.fuse_modules(train_block, ["conv", "bn"])
    qat = randomized_block().train()
    qat.bn = nn.BatchNorm2d(7)
    with pytest.raises(AssertionError, match="num_features"):
        tqq.fuse_modules_qat(qat, ["conv", "bn"])


def test_custom_fuser_func_and_get_fuser_method():
    def fuse_relu_pair(is_qat, a, b):
        return nn.Sequential(a, b)

    block = randomized_block()
    fused = tqq.fuse_modules(block, ["relu", "conv2"], fuse_custom_config_dict={
        "additional_fuser_method_mapping": {(nn.ReLU, nn.Conv2d): fuse_relu_pair}})
    assert isinstance(fused.relu, nn.Sequential)
    assert get_fuser_method((nn.Linear, nn.ReLU)) is not None
    with pytest.raises(AssertionError, match="did not find fuser method"):
        get_fuser_method((nn.ReLU, nn.Linear))
