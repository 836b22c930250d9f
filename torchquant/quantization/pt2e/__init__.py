"""``torchquant.quantization.pt2e`` — the internals of the PT2E (export) flow: observer insertion
(:mod:`.prepare`), observer -> quantize / dequantize rewriting (:mod:`.convert`) and graph helpers
(:mod:`.utils`).  The public entry points are in :mod:`torchquant.quantization.quantize_pt2e`.
"""
