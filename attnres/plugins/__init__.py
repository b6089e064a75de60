"""Native code shipped as sources and compiled on the target: CUDA kernels with a C ABI, TensorRT plugins.

Nothing is imported here so that ``import attnres.plugins`` costs nothing; use ``attnres.plugins.build``
(``build_plugins``, ``find_libraries``), ``attnres.plugins.cli`` and ``python -m attnres.plugins.selftest``.
"""
