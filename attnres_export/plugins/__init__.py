"""Native code shipped as sources and compiled on the target: CUDA kernels with a C ABI, TensorRT plugins.

Nothing is imported here so that ``import attnres_export.plugins`` costs nothing; use
``attnres_export.plugins.build`` (``build_plugins``, ``find_libraries``), ``attnres plugin build`` and
``python -m attnres_export.plugins.selftest``.
"""
