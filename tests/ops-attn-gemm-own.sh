#!/bin/sh
# test-ops-attn with CHORUS_OPENCL_GEMM=own: the batched GEMM through the
# tiled kernel of backends/opencl/gemm.cl instead of CLBlast.
CHORUS_OPENCL_GEMM=own exec ./tests/test-ops-attn "$@"
