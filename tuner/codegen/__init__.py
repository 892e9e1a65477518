"""Code generation: a chain and a config rendered into one CUDA source and its launch plan
(:mod:`.render`, from the Jinja2 templates in ``kernel_templates/``), compiled by NVRTC with a
disk cache (:mod:`.compile`), and what the compiler made of it (:mod:`.sass`).
"""
from .render import Launch, Rendered, render

__all__ = ["Launch", "Rendered", "render"]
