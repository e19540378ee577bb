"""hyper_ac's benchmark suite (run ``python -m benchmarks`` from the checkout; see README.md).

Not part of the ``hyper_ac`` package: the library never imports it.
"""
