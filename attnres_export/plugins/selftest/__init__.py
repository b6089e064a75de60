"""GPU self-test of the AttnResAggregate, AttnResAggregateNorm and ResidualScoreAttention kernels: correctness,
then speed.

``python -m attnres_export.plugins.selftest [--quick] [--op aggregate|aggregate_norm|rsa|all] [--json PATH]
[--dry-run]`` builds libattnres_kernels.so for the detected GPU and calls it through ctypes (no TensorRT). One
module per op on the shared base of ``common`` (``OpSelftest``, ``TimedOpSelftest``): ``aggregate``,
``aggregate_norm`` (correctness only) and ``rsa``; ``run`` drives them and prints plain-text tables (``table``),
each titled with the GPU (``sm_90 (NVIDIA H200)``), so runs on several architectures give one table each.
Exit 0: all checks pass; 1: a mismatch; 2: no GPU or the build failed.

Nothing is imported here, so that importing one op's module does not import the others.
"""
