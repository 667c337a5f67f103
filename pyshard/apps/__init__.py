"""Applications built on pyshard's public API: each module one application, importing the
library and never the benchmarks (:mod:`pyshard.bench` times them).

- :mod:`pyshard.apps.heat`: the explicit heat equation on halo exchanges (the stencil
  example's engine).

The distributed FFTs are :mod:`pyshard.fft` itself (the pencil 3-D FFT of the ``fft3d``
bench case is a :func:`pyshard.fft.plan`, ``pyshard/bench/fft3d.py``).
"""
