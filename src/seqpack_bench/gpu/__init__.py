"""The GPU benchmark: ``bash src/seqpack_bench/gpu/run.sh`` (or ``python -m seqpack_bench.gpu.bench_gpu``)."""
