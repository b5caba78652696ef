#!/bin/sh
# test-opencl with CHORUS_OPENCL_GEMM=own: the tiled GEMM kernel of
# backends/opencl/gemm.cl instead of CLBlast.
CHORUS_OPENCL_GEMM=own exec ./tests/test-opencl "$@"
