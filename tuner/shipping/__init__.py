"""Shipping a tuned result.

- :mod:`.export`: the best configs as JSON or a C++ header, or a study's measurements as a recording.
- :mod:`.bundle`: a runnable bundle (cubins, manifest, the C++ launcher in ``cpp/``).
- :mod:`.runtime`: runs a bundle's chains on CuPy arrays or PyTorch tensors.
- :mod:`.report` and :mod:`.results`: plots and pages from recorded bench summaries.
"""
