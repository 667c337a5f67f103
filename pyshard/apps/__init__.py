"""Applications built on pyshard's public API: each module one application, importing the
library and never the benchmarks (:mod:`pyshard.bench` times them).

- :mod:`pyshard.apps.fft3d`: a distributed 3-D FFT with pencil decomposition on a 2-D mesh.
"""
