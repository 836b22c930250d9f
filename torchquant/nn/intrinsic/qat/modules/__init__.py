from .conv_fused import (ConvBn1d, ConvBn2d, ConvBn3d, ConvBnReLU1d, ConvBnReLU2d, ConvBnReLU3d,
                         ConvReLU1d, ConvReLU2d, ConvReLU3d, freeze_bn_stats, update_bn_stats)
from .linear_fused import LinearBn1d
from .linear_relu import LinearReLU

__all__ = ["LinearReLU", "LinearBn1d", "ConvReLU1d", "ConvReLU2d", "ConvReLU3d",
           "ConvBn1d", "ConvBn2d", "ConvBn3d", "ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d",
           "update_bn_stats", "freeze_bn_stats"]
